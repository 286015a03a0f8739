package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/runtime"
	"github.com/forkbox/forkbox/internal/store"
)

// Hibernation saves a sandbox's memory and processes to disk and stops it:
// it holds no memory and no process until the next exec (or an explicit
// wake) restores it, state intact. Its files stay where they always are, in
// its writable layer on the host, and its address and egress policy are
// kept, so it wakes as itself. Its bridge port, veth pair and network
// namespace are not (a Linux bridge has 1,023 ports, and every mount on the
// host is copied into each new mount namespace): hibernated sandboxes give
// them back and get new ones when they wake, and a host keeps many more
// sessions than it runs.

// completeMarker is written into an image dir once the image is whole.
const completeMarker = "complete"

func (d *Daemon) hibernateDir(id string) string {
	_, hib := d.imageRoots()
	return filepath.Join(hib, id)
}

// memoryRuntime returns the sandbox's runtime if it can checkpoint memory.
func (d *Daemon) memoryRuntime(sb *store.Sandbox) (runtime.MemoryCheckpointer, runtime.Runtime, error) {
	rt := d.runtimes[sb.Runtime]
	mc, ok := rt.(runtime.MemoryCheckpointer)
	if !ok {
		return nil, nil, fmt.Errorf("sandbox %s runs on %s, which cannot checkpoint memory here (CRIU cannot dump on this kernel; use the gvisor runtime): %w",
			sb.ID, sb.Runtime, errdefs.ErrFailedPrecondition)
	}
	return mc, rt, nil
}

// Hibernate saves a running (or paused) sandbox to disk and stops it.
func (d *Daemon) Hibernate(ctx context.Context, idOrName string) (*store.Sandbox, error) {
	sb, _, err := d.hibernate(ctx, idOrName, false)
	return sb, err
}

// hibernateIfIdle hibernates a sandbox only if, under its lock, it is
// still idle for the configured time (an exec may have just started); done
// reports whether it did.
func (d *Daemon) hibernateIfIdle(ctx context.Context, id string) (done bool, err error) {
	_, done, err = d.hibernate(ctx, id, true)
	return done, err
}

func (d *Daemon) hibernate(ctx context.Context, idOrName string, onlyIfIdle bool) (_ *store.Sandbox, done bool, err error) {
	sb, unlock, err := d.locked(ctx, idOrName)
	if err != nil {
		return nil, false, err
	}
	defer unlock()
	if onlyIfIdle && (sb.State != store.StateRunning || d.idleFor(sb.ID, time.Now()) < d.cfg.IdleHibernate) {
		return sb, false, nil
	}
	if err := d.hibernateLocked(ctx, sb); err != nil {
		return nil, false, err
	}
	return sb, true, nil
}

// hibernateLocked hibernates a sandbox whose lock the caller holds.
func (d *Daemon) hibernateLocked(ctx context.Context, sb *store.Sandbox) (err error) {
	mc, rt, err := d.memoryRuntime(sb)
	if err != nil {
		return err
	}
	if err := requireState(sb, "hibernate", store.StateRunning, store.StatePaused); err != nil {
		return err
	}
	from := sb.State
	start := time.Now()
	dir := d.hibernateDir(sb.ID)
	if err := removeTree(dir); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
		return err
	}
	// Recorded first: after a crash, reconcile finds a whole image (the
	// sandbox is hibernated) or a running container (it never was).
	if err := d.setState(ctx, sb, store.StateHibernating, ""); err != nil {
		return err
	}
	var undo undoStack
	defer func() {
		if err != nil {
			err = errors.Join(err, undo.run(context.WithoutCancel(ctx)))
		}
	}()
	undo.push(func(ctx context.Context) error { return d.afterFailedCheckpoint(ctx, sb, rt, from) })
	if from == store.StatePaused {
		// gVisor checkpoints a running sandbox.
		if err := d.unsuspend(ctx, sb); err != nil {
			return err
		}
		undo.push(func(ctx context.Context) error { return d.suspend(ctx, sb) })
	}
	undo.push(func(context.Context) error { return removeTree(dir) })
	// Files first: what the sandbox wrote is on the host before it stops.
	if err := syncFS(d.rootfsDir(sb.ID)); err != nil {
		return fmt.Errorf("flush before hibernating: %w", err)
	}
	// From here on nothing may stop half-way because a caller went away.
	ctx = context.WithoutCancel(ctx)
	d.dropAgent(sb.ID) // the image must hold no live session (agents.go)
	if err := mc.Checkpoint(ctx, sb.ID, dir); err != nil {
		return fmt.Errorf("hibernate: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, completeMarker), nil, 0o600); err != nil {
		return err
	}
	// The image is whole: the sandbox is hibernated in substance. What
	// fails from here leaves it hibernating, which reconcile completes.
	undo.release()
	if err := d.deleteContainers(ctx, sb); err != nil {
		return fmt.Errorf("hibernate: release the stopped container: %w", err)
	}
	d.detach(ctx, sb)
	d.parkRootfs(ctx, sb)
	size := dirSize(dir)
	if err := d.setStateNoting(ctx, sb, store.StateHibernated, "", store.EventHibernated, map[string]any{"image_bytes": size, "ms": msSince(start)}); err != nil {
		return err
	}
	d.log.Info("sandbox hibernated", "sandbox", sb.ID, "image_bytes", size, "ms", msSince(start))
	return nil
}

// Wake restores a hibernated sandbox and returns once its agent answers.
func (d *Daemon) Wake(ctx context.Context, idOrName string) (*store.Sandbox, error) {
	sb, unlock, err := d.locked(ctx, idOrName)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if sb.State == store.StateRunning {
		return sb, nil
	}
	return sb, d.wakeLocked(ctx, sb)
}

func (d *Daemon) wakeLocked(ctx context.Context, sb *store.Sandbox) error {
	if err := requireState(sb, "wake", store.StateHibernated); err != nil {
		return err
	}
	mc, _, err := d.memoryRuntime(sb)
	if err != nil {
		return err
	}
	start := time.Now()
	dir := d.hibernateDir(sb.ID)
	ctx = context.WithoutCancel(ctx)
	if err := d.unparkRootfs(ctx, sb.ID); err != nil {
		return fmt.Errorf("wake: %w", err)
	}
	// A failed wake leaves it hibernated as it was: its rootfs parked too.
	woken := false
	defer func() {
		if !woken {
			d.parkRootfs(ctx, sb)
		}
	}()
	// Its place in the run directory, which a reboot empties.
	if err := d.net.KeepPlace(sb.ID); err != nil {
		return fmt.Errorf("wake: network: %w", err)
	}
	// Its bridge port first (given back when it hibernated): a full bridge
	// fails the wake with ResourceExhausted, the sandbox still hibernated.
	if err := d.net.Attach(ctx, sb.ID, netip.MustParseAddr(sb.IP), egressMode(sb.Config)); err != nil {
		return fmt.Errorf("wake: network: %w", err)
	}
	if err := d.restoreAsItself(ctx, sb, mc, dir); err != nil {
		// Still hibernated, its image whole: what the restore started
		// (the container, a pre-booted placeholder's) goes, as reconcile
		// would, so that the next wake can restore it again.
		if derr := d.deleteContainers(ctx, sb); !errdefs.IsNotFound(derr) {
			d.bestEffort(ctx, "wake: release what a failed restore left", derr, slog.String("sandbox", sb.ID))
		}
		d.detach(ctx, sb)
		return fmt.Errorf("wake: %w", err)
	}
	woken = true
	if err := d.setStateNoting(ctx, sb, store.StateRunning, "", store.EventWoken, map[string]any{"ms": msSince(start)}); err != nil {
		return err
	}
	d.restartLifetime(ctx, sb)
	d.bestEffort(ctx, "remove hibernation image", removeTree(dir), slog.String("sandbox", sb.ID))
	return nil
}

// detach gives back the network of sb, which holds no process (it is
// hibernated), all but its address and egress policy: its bridge port (a
// bridge has network.MaxBridgePorts, and only sandboxes that run need
// one), its veth pair and its netns's mount (every mount on the host
// slows each gVisor start, restore and wake). Wake attaches it again. A
// failure only keeps them until then.
func (d *Daemon) detach(ctx context.Context, sb *store.Sandbox) {
	d.bestEffort(ctx, "give back the bridge port of a hibernated sandbox", d.net.Detach(ctx, sb.ID, netip.MustParseAddr(sb.IP)),
		slog.String("sandbox", sb.ID))
}

// hibernationComplete reports whether a sandbox has a whole hibernation image.
func (d *Daemon) hibernationComplete(id string) bool {
	_, err := os.Stat(filepath.Join(d.hibernateDir(id), completeMarker))
	return err == nil
}

func dirSize(dir string) int64 {
	var n int64
	filepath.WalkDir(dir, func(_ string, e os.DirEntry, err error) error {
		if err == nil && !e.IsDir() {
			if in, err := e.Info(); err == nil {
				n += in.Size()
			}
		}
		return nil
	})
	return n
}

// afterFailedCheckpoint records what a failed memory checkpoint left: back
// (the state before it) if the container still runs, failed otherwise.
func (d *Daemon) afterFailedCheckpoint(ctx context.Context, sb *store.Sandbox, rt runtime.Runtime, back store.State) error {
	if st, err := rt.State(ctx, sb.ID); err == nil && alive(st) {
		if sb.State == back {
			return nil
		}
		return d.setState(ctx, sb, back, "")
	}
	return d.setState(ctx, sb, store.StateFailed, "a memory checkpoint failed and stopped the sandbox")
}
