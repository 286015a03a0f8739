package daemon

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/image"
	"github.com/forkbox/forkbox/internal/store"
)

// MaxForkCount bounds the children of one fork call.
const MaxForkCount = 100

// forkParallelism is how many children start at once.
const forkParallelism = 4

// Overrides replace what a child inherits; zero fields are inherited.
type Overrides struct {
	CPU, Memory string
	Pids        int64
	Env         map[string]string
	Cwd         string
	Egress      string
	Name        string
}

// ForkOptions is one fork call.
type ForkOptions struct {
	Source         string
	Tag            string
	Count          int
	Overrides      Overrides
	Credentials    map[string]string
	FromCheckpoint string
	BestEffort     bool
	// Memory forks memory and processes too (gVisor): children continue
	// the source's processes.
	Memory bool
}

// ForkChild is one child's outcome: a sandbox or an error.
type ForkChild struct {
	Sandbox *store.Sandbox
	Err     error
	StartMS float64
}

// ForkResult is what a fork captured and started.
type ForkResult struct {
	Checkpoint *store.Checkpoint
	Captured   string
	CaptureMS  float64
	Children   []ForkChild
	TotalMS    float64
}

// childConfig applies overrides to an inherited config.
func childConfig(base store.SandboxConfig, o Overrides) (store.SandboxConfig, error) {
	cfg := base
	var err error
	if o.CPU != "" {
		if cfg.CPU, err = ParseCPU(o.CPU); err != nil {
			return cfg, err
		}
		cfg.CPUString = o.CPU
	}
	if o.Memory != "" {
		if cfg.MemoryBytes, err = ParseMemory(o.Memory); err != nil {
			return cfg, err
		}
		cfg.MemoryStr = o.Memory
	}
	if o.Pids != 0 {
		if cfg.Pids, err = ParsePids(o.Pids); err != nil {
			return cfg, err
		}
	}
	if len(o.Env) > 0 {
		env := map[string]string{}
		for k, v := range base.Env {
			env[k] = v
		}
		for k, v := range o.Env {
			if !envKeyRE.MatchString(k) {
				return cfg, fmt.Errorf("env name %q is not a valid variable name: %w", k, errdefs.ErrInvalidArgument)
			}
			env[k] = v
		}
		cfg.Env = env
	}
	if o.Cwd != "" {
		cfg.Cwd = o.Cwd
	}
	switch o.Egress {
	case "":
	case "none", "all":
		cfg.Egress = o.Egress
	default:
		return cfg, fmt.Errorf("egress %q: want none or all: %w", o.Egress, errdefs.ErrInvalidArgument)
	}
	return cfg, nil
}

// Fork checkpoints the source (or uses an existing checkpoint of it) and
// starts Count children from that snapshot. The source keeps running. One
// child failing does not fail the others. There is no fallback: without a
// usable snapshot the call fails with FailedPrecondition.
func (d *Daemon) Fork(ctx context.Context, o ForkOptions) (*ForkResult, error) {
	start := time.Now()
	if o.Count == 0 {
		o.Count = 1
	}
	if o.Count < 0 || o.Count > MaxForkCount {
		return nil, fmt.Errorf("count %d: want 1 to %d: %w", o.Count, MaxForkCount, errdefs.ErrInvalidArgument)
	}
	if o.Overrides.Name != "" && o.Count > 1 {
		return nil, fmt.Errorf("a name override needs count 1 (names are unique): %w", errdefs.ErrInvalidArgument)
	}
	if o.Overrides.Name != "" && !nameRE.MatchString(o.Overrides.Name) {
		return nil, fmt.Errorf("name %q is not valid: %w", o.Overrides.Name, errdefs.ErrInvalidArgument)
	}
	src, err := d.store.GetSandbox(ctx, o.Source)
	if err != nil {
		return nil, err
	}
	// Everything is checked before anything is made.
	var ck *store.Checkpoint
	if o.FromCheckpoint != "" {
		if ck, err = d.store.GetCheckpoint(ctx, o.FromCheckpoint); err != nil {
			return nil, err
		}
		if ck.SandboxID != src.ID {
			return nil, fmt.Errorf("checkpoint %s is not of sandbox %s: %w", ck.ID, src.ID, errdefs.ErrInvalidArgument)
		}
	} else if src.State != store.StateRunning && src.State != store.StatePaused {
		return nil, fmt.Errorf("sandbox %s is %s: there is nothing to snapshot (fork from one of its checkpoints, or restore one): %w",
			src.ID, src.State, errdefs.ErrFailedPrecondition)
	}
	if o.Memory && ck == nil {
		if src.State == store.StateHibernated {
			return nil, fmt.Errorf("sandbox %s is hibernated: wake it for a memory fork: %w", src.ID, errdefs.ErrFailedPrecondition)
		}
		if _, _, err := d.memoryRuntime(src); err != nil {
			return nil, err
		}
	}
	cfgBase := src.Config
	if ck != nil {
		cfgBase = ck.Config
	}
	cfg, err := childConfig(cfgBase, o.Overrides)
	if err != nil {
		return nil, err
	}
	creds, err := d.inheritedCredentials(ctx, src.ID, o.Credentials)
	if err != nil {
		return nil, err
	}
	img, err := d.checkpointImage(ctx, src.Image, src.ImageDigest)
	if err != nil {
		return nil, err
	}
	granted, err := d.reserveSlots(ctx, o.Count, o.BestEffort)
	if err != nil {
		return nil, err
	}
	used := 0
	defer func() { d.releaseSlots(granted - used) }()

	res := &ForkResult{}
	if ck == nil {
		unlock := d.lock(src.ID)
		if src, err = d.live(ctx, src.ID); err == nil {
			if o.Memory {
				ck, err = d.checkpointMemoryLocked(ctx, src, o.Tag)
			} else {
				ck, err = d.checkpointLocked(ctx, src, o.Tag)
			}
		}
		unlock()
		if err != nil {
			return nil, err
		}
		res.CaptureMS = ck.CaptureMS
	}
	res.Checkpoint, res.Captured = ck, ck.Kind
	var mem *store.Checkpoint
	if ck.Kind == KindMemory {
		mem = ck
	}
	res.Children = make([]ForkChild, o.Count)
	sem := make(chan struct{}, forkParallelism)
	var wg sync.WaitGroup
	for i := range o.Count {
		if i >= granted {
			res.Children[i].Err = fmt.Errorf("child %d of %d: no free sandbox slot: %w", i+1, o.Count, errdefs.ErrResourceExhausted)
			continue
		}
		used++
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			t := time.Now()
			name := o.Overrides.Name
			if name == "" {
				name = "fork-" + src.Name + "-" + randomHex(3)
			}
			sb, err := d.launch(ctx, launchSpec{name: name, runtime: ck.Runtime, cfg: cfg, img: img,
				parentSnapshot: ck.ID, parentID: src.ID, creds: creds, slotReserved: true, memory: mem,
				event: map[string]any{"forked_from": src.ID, "checkpoint": ck.ID, "tag": ck.Tag}})
			res.Children[i] = ForkChild{Sandbox: sb, Err: err, StartMS: msSince(t)}
		}()
	}
	wg.Wait()
	var ids []string
	for _, c := range res.Children {
		if c.Sandbox != nil {
			ids = append(ids, c.Sandbox.ID)
		}
	}
	d.store.AppendEvent(ctx, src.ID, store.EventForked, map[string]any{"checkpoint": ck.ID, "tag": ck.Tag, "children": ids, "requested": o.Count})
	res.TotalMS = msSince(start)
	return res, nil
}

// checkpointImage returns the image a checkpoint's children mount under
// their writable layer: it must still be in the store.
func (d *Daemon) checkpointImage(ctx context.Context, name, digest string) (image.Image, error) {
	img, err := d.images.Get(ctx, digest)
	if err != nil {
		if errdefs.IsNotFound(err) {
			return image.Image{}, fmt.Errorf("the image %s (%s) of this snapshot was removed: %w", name, digest, errdefs.ErrFailedPrecondition)
		}
		return image.Image{}, err
	}
	return img, nil
}
