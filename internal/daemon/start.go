package daemon

import (
	"context"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/agent"
	"github.com/forkbox/forkbox/internal/image"
	"github.com/forkbox/forkbox/internal/network"
	"github.com/forkbox/forkbox/internal/store"
)

// Starting a sandbox from a checkpoint is one path for every caller: a fork's
// children, a restore, a resumed session and an environment's hand-over.
// Its config is the checkpoint's with the caller's overrides, checked by
// the same rules as a create's.

// Overrides replace what a child inherits; zero fields are inherited.
type Overrides struct {
	CPU, Memory string
	Pids        int64
	Disk        string
	Env         map[string]string
	Cwd         string
	Egress      string
	// EgressAllow and EgressDeny, with Egress, replace the inherited egress
	// policy as a whole when any of the three is given.
	EgressAllow, EgressDeny []string
	Name                    string
	// Timeout (0: inherited) and OnTimeout ("": inherited): see
	// CreateOptions. The child's deadline is its start plus its timeout.
	Timeout   time.Duration
	OnTimeout string
}

var (
	nameRE   = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}$`)
	envKeyRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
)

// maxEnvBytes bounds a sandbox's whole environment (names and values).
const maxEnvBytes = 256 << 10

// checkName checks a sandbox name given by a caller.
func checkName(name string) error {
	if !nameRE.MatchString(name) {
		return fmt.Errorf("name %q: use 1-63 letters, digits, '_', '.' or '-', starting with a letter or digit: %w", name, errdefs.ErrInvalidArgument)
	}
	return nil
}

// defaultConfig is the config of a sandbox created with no options.
func defaultConfig() store.SandboxConfig {
	return store.SandboxConfig{CPU: DefaultCPU, MemoryBytes: DefaultMemory, Pids: DefaultPids, Egress: "none"}
}

// withOverrides checks overrides and applies them to base; it changes
// nothing else. Every sandbox config a caller shapes goes through it: a
// create applies its options to defaultConfig, the other starts theirs to
// the checkpoint's config.
func withOverrides(base store.SandboxConfig, o Overrides) (store.SandboxConfig, error) {
	cfg := base
	var err error
	if o.Name != "" {
		if err := checkName(o.Name); err != nil {
			return cfg, err
		}
	}
	if err := checkTimeout(o.Timeout, o.OnTimeout); err != nil {
		return cfg, err
	}
	if o.Timeout > 0 {
		cfg.TimeoutMS = max(o.Timeout.Milliseconds(), 1)
	}
	if o.OnTimeout != "" {
		cfg.OnTimeout = o.OnTimeout
	}
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
	if err := applyDisk(&cfg, o.Disk); err != nil {
		return cfg, err
	}
	if len(o.Env) > 0 {
		env := make(map[string]string, len(base.Env)+len(o.Env))
		for k, v := range base.Env {
			env[k] = v
		}
		for k, v := range o.Env {
			if !envKeyRE.MatchString(k) {
				return cfg, fmt.Errorf("env name %q is not a valid variable name: %w", k, errdefs.ErrInvalidArgument)
			}
			if strings.HasPrefix(k, agent.EnvPrefix) {
				return cfg, fmt.Errorf("env name %q: %s names configure the sandbox's agent and are reserved: %w", k, agent.EnvPrefix, errdefs.ErrInvalidArgument)
			}
			if strings.ContainsRune(v, 0) {
				return cfg, fmt.Errorf("env %s: the value holds a NUL byte: %w", k, errdefs.ErrInvalidArgument)
			}
			env[k] = v
		}
		size := 0
		for k, v := range env {
			size += len(k) + len(v)
		}
		if size > maxEnvBytes {
			return cfg, fmt.Errorf("env is %d bytes, more than %d: %w", size, maxEnvBytes, errdefs.ErrResourceExhausted)
		}
		cfg.Env = env
	}
	if o.Cwd != "" {
		if strings.ContainsRune(o.Cwd, 0) {
			return cfg, fmt.Errorf("cwd %q holds a NUL byte: %w", o.Cwd, errdefs.ErrInvalidArgument)
		}
		if !filepath.IsAbs(o.Cwd) {
			return cfg, fmt.Errorf("cwd %q must be absolute: %w", o.Cwd, errdefs.ErrInvalidArgument)
		}
		cfg.Cwd = o.Cwd
	}
	if o.Egress != "" || len(o.EgressAllow)+len(o.EgressDeny) > 0 {
		pol, err := network.ParsePolicy(o.Egress, o.EgressAllow, o.EgressDeny)
		if err != nil {
			return cfg, err
		}
		cfg.Egress = string(pol.Mode)
		cfg.EgressAllow, cfg.EgressDeny = pol.Lists()
	}
	return cfg, nil
}

// startOptions is a sandbox to start from a checkpoint.
type startOptions struct {
	checkpoint *store.Checkpoint
	// overrides shape the checkpoint's config (checked by withOverrides).
	overrides Overrides
	// defaultName is the name when overrides.Name is "".
	defaultName string
	// parentID is the sandbox the new one descends from (default: the
	// checkpoint's sandbox).
	parentID string
	// creds are copied to the new sandbox (sealed values).
	creds []*store.Credential
	// slotReserved: reserveSlots set a slot aside for it; it is used or
	// given back whatever happens.
	slotReserved bool
	// pool is the environment whose warm pool it joins.
	pool string
	// event is extra data for its sandbox.created event.
	event map[string]any
}

// startFromCheckpoint starts a sandbox from a checkpoint: the checkpoint's
// config with the checked overrides, its image, its memory image if it has
// one (the sandbox continues the checkpointed processes), launched as any
// sandbox is. Nothing is made if a check fails.
func (d *Daemon) startFromCheckpoint(ctx context.Context, o startOptions) (*store.Sandbox, error) {
	ck := o.checkpoint
	cfg, img, err := d.checkStart(ctx, ck.Config, ck.Runtime, ck.Image, ck.ImageDigest, o.overrides)
	if err != nil {
		if o.slotReserved {
			d.releaseSlots(1)
		}
		return nil, err
	}
	name := o.overrides.Name
	if name == "" {
		name = o.defaultName
	}
	parent := o.parentID
	if parent == "" {
		parent = ck.SandboxID
	}
	return d.launch(ctx, launchSpec{name: name, runtime: ck.Runtime, cfg: cfg, img: img, parentSnapshot: ck.ID, parentID: parent,
		creds: o.creds, slotReserved: o.slotReserved, pool: o.pool, event: o.event, memory: memoryOf(ck)})
}

// checkStart checks everything a start from a snapshot of the given config,
// runtime and image needs, and returns the child's config and the image. A
// fork calls it before it captures anything.
func (d *Daemon) checkStart(ctx context.Context, base store.SandboxConfig, rt, imageName, digest string, o Overrides) (store.SandboxConfig, image.Image, error) {
	cfg, err := withOverrides(base, o)
	if err != nil {
		return cfg, image.Image{}, err
	}
	if err := d.checkDisk(cfg); err != nil {
		return cfg, image.Image{}, err
	}
	if _, ok := d.runtimes[rt]; !ok {
		return cfg, image.Image{}, fmt.Errorf("the snapshot's runtime %q is not available on this daemon: %w", rt, errdefs.ErrFailedPrecondition)
	}
	if err := d.checkOnTimeout(cfg, rt); err != nil {
		return cfg, image.Image{}, err
	}
	img, err := d.checkpointImage(ctx, imageName, digest)
	return cfg, img, err
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

// memoryOf returns ck if it holds memory (its children restore it).
func memoryOf(ck *store.Checkpoint) *store.Checkpoint {
	if ck.Kind == KindMemory {
		return ck
	}
	return nil
}
