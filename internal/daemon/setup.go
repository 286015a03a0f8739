package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/network"
	"github.com/forkbox/forkbox/internal/runtime"
	"github.com/forkbox/forkbox/internal/runtime/crun"
	"github.com/forkbox/forkbox/internal/runtime/ocicli"
	"github.com/forkbox/forkbox/internal/runtime/runsc"
	"github.com/forkbox/forkbox/internal/snapshot"
	"github.com/forkbox/forkbox/internal/snapshot/btrfs"
	"github.com/forkbox/forkbox/internal/snapshot/naive"
	"github.com/forkbox/forkbox/internal/store"
)

const snapshotActive = snapshot.KindActive

// openSnapshotter opens the configured snapshotter. btrfs is the default;
// when it cannot be used the daemon says so and falls back to plain copies,
// whose forks cost O(data).
func openSnapshotter(ctx context.Context, cfg Config, log *slog.Logger) (snapshot.Snapshotter, error) {
	root := filepath.Join(cfg.StateDir, "snapshots")
	switch cfg.Snapshotter {
	case "btrfs":
		if err := btrfs.Supported(ctx); err != nil {
			return nil, fmt.Errorf("btrfs snapshotter unavailable (%v); start with --snapshotter=copy to use slow full copies: %w", err, errdefs.ErrFailedPrecondition)
		}
		s, err := btrfs.Open(ctx, root, btrfs.Options{LoopSize: cfg.BtrfsSize, Log: log, Preallocate: cfg.BtrfsPreallocate})
		if err != nil {
			return nil, err
		}
		return s, nil
	case "copy":
		log.Warn("using the copy snapshotter: every fork copies the sandbox's whole writable layer (slow); use btrfs for O(1) forks")
		s, err := naive.Open(ctx, root, log)
		if err != nil {
			return nil, err
		}
		return s, nil
	}
	return nil, fmt.Errorf("snapshotter %q: want btrfs or copy: %w", cfg.Snapshotter, errdefs.ErrInvalidArgument)
}

func newNetwork(ctx context.Context, cfg Config, log *slog.Logger) (*network.Manager, error) {
	ncfg := network.Config{Bridge: cfg.Bridge, Table: cfg.NetTable, VethPrefix: cfg.VethPrefix,
		NetnsDir: filepath.Join(cfg.RunDir, "netns"), NetnsDirJoinsParent: cfg.PropagateSandboxMounts, Log: log}
	if cfg.Subnet != "" {
		p, err := netip.ParsePrefix(cfg.Subnet)
		if err != nil {
			return nil, fmt.Errorf("subnet %q: %w", cfg.Subnet, errdefs.ErrInvalidArgument)
		}
		ncfg.Subnet = p
	}
	return network.New(ctx, ncfg)
}

// Runtime names, as users give them.
const (
	RuntimeGVisor = "gvisor"
	RuntimeCrun   = "crun"
)

// runtimeLogDir holds the runtimes' own logs, a file per container.
func (d *Daemon) runtimeLogDir() string { return filepath.Join(d.cfg.StateDir, "logs") }

// openRuntimes opens every runtime this host has. gVisor is required
// unless crun is the default; a missing crun is logged, and sandboxes that
// ask for it get a clear error.
func (d *Daemon) openRuntimes(cfg Config) error {
	logs := d.runtimeLogDir()
	ro := runsc.Options{Binary: cfg.RuntimeBinary, Root: filepath.Join(cfg.RunDir, "runsc"), LogDir: logs, Standby: cfg.RunscStandby, Log: d.log,
		// Each sandbox's rootfs and netns mounts: runsc starts see their
		// own sandbox's only, not the host's thousands (runsc/view.go).
		HideMountsUnder: []string{d.bundlesDir(), filepath.Join(cfg.RunDir, "netns")},
		KeepMountsUnder: []string{cfg.StateDir, cfg.RunDir, filepath.Dir(cfg.AgentPath)},
		SharedHidden:    cfg.PropagateSandboxMounts}
	if cfg.RunscHugePages {
		ro.StageDir = filepath.Join(cfg.RunDir, "runsc-bin")
	}
	rs, err := runsc.New(ro)
	if err == nil {
		d.runtimes[RuntimeGVisor] = rs
	} else {
		d.log.Warn("gVisor runtime unavailable", "err", err)
	}
	cr, cerr := crun.New(crun.Options{Binary: cfg.CrunBinary, Root: filepath.Join(cfg.RunDir, "crun"), LogDir: logs, Log: d.log})
	if cerr == nil {
		d.runtimes[RuntimeCrun] = cr
	} else {
		d.log.Warn("crun runtime unavailable", "err", cerr)
	}
	if _, ok := d.runtimes[cfg.DefaultRuntime]; !ok {
		return fmt.Errorf("default runtime %q is not available (gvisor: %v; crun: %v): %w", cfg.DefaultRuntime, err, cerr, errdefs.ErrFailedPrecondition)
	}
	return nil
}

// RunscStandbyStats reports gVisor's standby runsc processes (zero
// without gVisor or without them).
func (d *Daemon) RunscStandbyStats() runsc.StandbyStats {
	if rs, ok := d.runtimes[RuntimeGVisor].(*runsc.Runsc); ok {
		return rs.StandbyStats()
	}
	return runsc.StandbyStats{}
}

// initOutput returns the end of what a sandbox's init (the agent) and the
// runtime printed, for error messages.
func (d *Daemon) initOutput(id string) string {
	return ocicli.Tail(filepath.Join(d.bundleDir(id), runtime.LogFileName), 1024)
}

func fsMode(m uint32) os.FileMode { return os.FileMode(m & 0o7777) }

// Get returns a sandbox's record.
func (d *Daemon) Get(ctx context.Context, idOrName string) (*store.Sandbox, error) {
	return d.store.GetSandbox(ctx, idOrName)
}

// List lists sandboxes; closed ones only when all is set.
func (d *Daemon) List(ctx context.Context, all bool) ([]*store.Sandbox, error) {
	return d.store.ListSandboxes(ctx, all)
}

// ListPage is one page of List, with the token of the next ("" after the
// last); see store.Page.
func (d *Daemon) ListPage(ctx context.Context, all bool, p store.Page) ([]*store.Sandbox, string, error) {
	return d.store.ListSandboxesPage(ctx, all, p)
}

// EventsPage is one page of Events, with the token of the next ("" after
// the last).
func (d *Daemon) EventsPage(ctx context.Context, idOrName string, p store.Page) ([]*store.Event, string, error) {
	id := idOrName
	if name, ok := strings.CutPrefix(idOrName, "env:"); ok {
		if _, err := d.store.GetEnvironment(ctx, name); err != nil {
			return nil, "", err
		}
	} else {
		sb, err := d.store.GetSandbox(ctx, idOrName)
		if err != nil {
			return nil, "", err
		}
		id = sb.ID
	}
	evs, next, err := d.store.EventsPage(ctx, id, p)
	return publicEvents(evs), next, err // replay input stays sealed and out of sight
}

// Events returns a sandbox's ledger, or an environment's with "env:<name>"
// (its builds, steps and hand-overs).
func (d *Daemon) Events(ctx context.Context, idOrName string) ([]*store.Event, error) {
	if name, ok := strings.CutPrefix(idOrName, "env:"); ok {
		if _, err := d.store.GetEnvironment(ctx, name); err != nil {
			return nil, err
		}
		return d.store.Events(ctx, idOrName)
	}
	sb, err := d.store.GetSandbox(ctx, idOrName)
	if err != nil {
		return nil, err
	}
	evs, err := d.store.Events(ctx, sb.ID)
	return publicEvents(evs), err // replay input stays sealed and out of sight
}
