package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"syscall"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/cgroups"
	"github.com/forkbox/forkbox/internal/mount"
	"github.com/forkbox/forkbox/internal/store"
)

// Delete closes a sandbox: its processes, container, network, rootfs mount,
// writable layer and bundle are removed, and the ledger records it.
func (d *Daemon) Delete(ctx context.Context, idOrName string) error {
	sb, unlock, err := d.locked(ctx, idOrName)
	if err != nil {
		return err
	}
	defer unlock()
	return d.deleteLocked(ctx, sb)
}

// deleteLocked is Delete for a caller that holds the sandbox's lock.
func (d *Daemon) deleteLocked(ctx context.Context, sb *store.Sandbox) error {
	if sb.State == store.StateClosed {
		return fmt.Errorf("sandbox %s is already closed: %w", sb.ID, errdefs.ErrNotFound)
	}
	if sb.State != store.StateClosing {
		if err := d.setState(ctx, sb, store.StateClosing, sb.Error); err != nil {
			return err
		}
	}
	ctx = context.WithoutCancel(ctx)
	if err := d.teardown(ctx, sb); err != nil {
		d.recordState(ctx, sb, store.StateFailed, err.Error())
		return fmt.Errorf("close %s: %w", sb.ID, err)
	}
	if err := d.setStateNoting(ctx, sb, store.StateClosed, sb.Error, store.EventSandboxClosed, nil); err != nil {
		return err
	}
	d.forget(sb.ID)
	d.log.Info("sandbox closed", "sandbox", sb.ID)
	return nil
}

// teardown removes everything a sandbox may own on the host. Every step is
// idempotent, so it also cleans half-made sandboxes after a crash.
func (d *Daemon) teardown(ctx context.Context, sb *store.Sandbox) error {
	d.dropAgent(sb.ID)
	var errs []error
	// A paused crun sandbox is frozen, and frozen tasks (cgroup v1) ignore
	// SIGKILL (a paused gVisor sandbox is stopped inside its sentry, which
	// the kill ends as it is). Neither step's error matters: a sandbox that
	// is not frozen, or not running, is what they make; Delete below
	// reports what is left.
	_ = d.host.Thaw(ctx, d.cgroupPath(sb.ID))
	if rt, ok := d.runtimes[sb.Runtime]; ok {
		_ = rt.Kill(ctx, sb.ID, syscall.SIGKILL, true)
		if err := d.deleteContainers(ctx, sb); err != nil {
			errs = append(errs, fmt.Errorf("delete container: %w", err))
		}
	}
	if err := d.net.Teardown(ctx, sb.ID); err != nil {
		errs = append(errs, fmt.Errorf("network: %w", err))
	}
	if err := d.unmountRootfs(ctx, sb.ID); err != nil {
		errs = append(errs, fmt.Errorf("unmount rootfs: %w", err))
	}
	if err := d.snaps.Remove(ctx, sb.ID); err != nil && !errdefs.IsNotFound(err) {
		errs = append(errs, fmt.Errorf("remove writable layer: %w", err))
	}
	if err := cgroups.Remove(ctx, d.cgroupPath(sb.ID)); err != nil {
		errs = append(errs, err)
	}
	if err := removeTree(d.bundleDir(sb.ID)); err != nil {
		errs = append(errs, fmt.Errorf("bundle: %w", err))
	}
	if err := removeTree(d.hibernateDir(sb.ID)); err != nil {
		errs = append(errs, fmt.Errorf("hibernation image: %w", err))
	}
	if err := d.removeRuntimeLogs(sb.ID); err != nil {
		errs = append(errs, fmt.Errorf("runtime logs: %w", err))
	}
	return errors.Join(errs...)
}

// removeRuntimeLogs removes the runtimes' logs of sandbox id, its
// placeholder's too (pre-booted): kept for nothing once it is closed, they
// grew by a file or two per sandbox for ever.
func (d *Daemon) removeRuntimeLogs(id string) error {
	var errs []error
	for _, name := range []string{id + ".log", podID(id) + ".log"} {
		if err := os.Remove(filepath.Join(d.runtimeLogDir(), name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// maxRootfsMounts bounds how many mounts teardown takes off a rootfs: one
// is what create makes; more is a defect somewhere, cleaned up all the same.
const maxRootfsMounts = 16

// unmountRootfs unmounts a sandbox's rootfs until nothing is mounted there,
// so that a rootfs mounted more than once (a defect elsewhere) does not keep
// its writable layer busy for ever. Unmount takes off the topmost mount
// only.
func (d *Daemon) unmountRootfs(ctx context.Context, id string) error {
	dir := d.rootfsDir(id)
	for i := 1; i <= maxRootfsMounts; i++ {
		if err := d.host.Unmount(ctx, dir); err != nil {
			return err
		}
		mounted, err := mount.IsMountPoint(dir)
		if err != nil {
			return err
		}
		if !mounted {
			return nil
		}
		d.log.Warn("rootfs is still mounted after an unmount; unmounting again",
			slog.String("sandbox", id), slog.Int("unmounted", i))
	}
	return fmt.Errorf("%s is still mounted after %d unmounts: %w", dir, maxRootfsMounts, errdefs.ErrFailedPrecondition)
}

// removeTree deletes a directory by renaming it to a tombstone first, so a
// crash never leaves a half-deleted directory under its live name.
func removeTree(dir string) error {
	if _, err := os.Lstat(dir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	tomb := filepath.Join(filepath.Dir(dir), ".rm-"+filepath.Base(dir))
	if err := os.Rename(dir, tomb); err != nil {
		return err
	}
	return os.RemoveAll(tomb)
}
