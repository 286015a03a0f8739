package daemon

import (
	"context"
	"fmt"
	goruntime "runtime"
	"sync"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/store"
)

// MaxForkCount bounds the children of one fork call.
const MaxForkCount = 100

// forkParallelism is how many children of one fork start at once: two
// per core (a child's start waits on runsc and its agent about as long as
// it computes), at least 2 and at most 16. 4 on a 2-core host.
var forkParallelism = min(max(2*goruntime.NumCPU(), 2), 16)

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
	// SourceDowntimeMS is how long the source stood still for a memory
	// fork (0 for a filesystem fork, whose freeze is CaptureMS).
	SourceDowntimeMS float64
	Children         []ForkChild
	TotalMS          float64
}

// Fork checkpoints the source (or uses an existing checkpoint of it) and
// starts Count children from that snapshot. The source keeps running. One
// child failing does not fail the others. There is no fallback: without a
// usable snapshot the call fails with FailedPrecondition.
func (d *Daemon) Fork(ctx context.Context, o ForkOptions) (*ForkResult, error) {
	return d.ForkStream(ctx, o, ForkEvents{})
}

// ForkEvents receive a fork's progress as it happens (ForkStream). Either
// may be nil. They are called one at a time, never after ForkStream
// returns.
type ForkEvents struct {
	// Captured is called once the snapshot is taken (res has no children
	// yet), before any child starts.
	Captured func(res *ForkResult)
	// Child is called with child i's outcome as soon as it is ready or has
	// failed, before the next waiting child takes its start slot; children
	// that get no slot are reported first.
	Child func(i int, c ForkChild)
}

// ForkStream is Fork, reporting the capture and each child to ev as they
// happen; it returns the whole result as Fork does.
func (d *Daemon) ForkStream(ctx context.Context, o ForkOptions, ev ForkEvents) (*ForkResult, error) {
	defer d.busyUntil()()
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
	} else if err := requireState(src, "fork", store.StateRunning, store.StatePaused); err != nil {
		return nil, fmt.Errorf("%w; there is nothing to snapshot: fork from one of its checkpoints, or restore one", err)
	}
	if o.Memory && ck == nil {
		if src.State == store.StateHibernated {
			return nil, fmt.Errorf("sandbox %s is hibernated: wake it for a memory fork: %w", src.ID, errdefs.ErrFailedPrecondition)
		}
		if _, _, err := d.memoryRuntime(src); err != nil {
			return nil, err
		}
	}
	// The children's start is checked now, against what the checkpoint
	// will hold, so that nothing is captured for children that cannot start.
	base := &store.Checkpoint{Config: src.Config, Runtime: src.Runtime, Image: src.Image, ImageDigest: src.ImageDigest}
	if ck != nil {
		base = ck
	}
	if _, _, err := d.checkStart(ctx, base.Config, base.Runtime, base.Image, base.ImageDigest, o.Overrides); err != nil {
		return nil, err
	}
	creds, err := d.inheritedCredentials(ctx, src.ID, o.Credentials)
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
				ck, res.SourceDowntimeMS, err = d.checkpointMemoryLocked(ctx, src, o.Tag, false)
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
	if ev.Captured != nil {
		ev.Captured(res)
	}
	res.Children = make([]ForkChild, o.Count)
	var evMu sync.Mutex // results and events, one child at a time
	report := func(i int, c ForkChild) {
		evMu.Lock()
		defer evMu.Unlock()
		res.Children[i] = c
		if ev.Child != nil {
			ev.Child(i, c)
		}
	}
	for i := granted; i < o.Count; i++ {
		report(i, ForkChild{Err: fmt.Errorf("child %d of %d: no free sandbox slot: %w", i+1, o.Count, errdefs.ErrResourceExhausted)})
	}
	sem := make(chan struct{}, forkParallelism)
	var wg sync.WaitGroup
	for i := range min(granted, o.Count) {
		used++
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			t := time.Now()
			sb, err := d.startFromCheckpoint(ctx, startOptions{checkpoint: ck, overrides: o.Overrides,
				defaultName: "fork-" + src.Name + "-" + randomHex(3), parentID: src.ID, creds: creds, slotReserved: true,
				event: map[string]any{"forked_from": src.ID, "checkpoint": ck.ID, "tag": ck.Tag}})
			// Reported before the slot is given back: the next child starts
			// after this one is known.
			report(i, ForkChild{Sandbox: sb, Err: err, StartMS: msSince(t)})
		}()
	}
	wg.Wait()
	var ids []string
	for _, c := range res.Children {
		if c.Sandbox != nil {
			ids = append(ids, c.Sandbox.ID)
		}
	}
	d.note(ctx, src.ID, store.EventForked, map[string]any{"checkpoint": ck.ID, "tag": ck.Tag, "children": ids, "requested": o.Count})
	res.TotalMS = msSince(start)
	return res, nil
}
