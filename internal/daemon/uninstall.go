package daemon

import (
	"context"
	"errors"
	"os"
	"path/filepath"

	"github.com/forkbox/forkbox/internal/memvault"
	"github.com/forkbox/forkbox/internal/mount"
	"github.com/forkbox/forkbox/internal/snapshot/btrfs"
)

// Uninstall closes every live sandbox and removes the daemon's host-level
// state: the bridge and nftables tables, the btrfs loop mount and device,
// the netns mount and the cgroup parent. The state directory (database,
// images, checkpoints) is kept unless purge is set. The daemon is closed
// after it and must not be used again.
func (d *Daemon) Uninstall(ctx context.Context, purge bool) error {
	var errs []error
	live, err := d.store.ListSandboxes(ctx, false)
	errs = append(errs, err)
	for _, sb := range live {
		errs = append(errs, d.Delete(ctx, sb.ID))
	}
	errs = append(errs, d.net.Destroy(ctx), d.Close())
	if d.cfg.Snapshotter == "btrfs" {
		errs = append(errs, btrfs.Detach(ctx, filepath.Join(d.cfg.StateDir, "snapshots")))
	}
	errs = append(errs, memvault.Detach(ctx, d.vaultRoot()))
	if mps, err := mount.Under(d.cfg.RunDir); err == nil {
		for _, mp := range mps {
			errs = append(errs, mount.Unmount(ctx, mp))
		}
	}
	errs = append(errs, d.unmountBundles(ctx))
	for _, root := range cgroupRoots() {
		if err := os.Remove(filepath.Join(root, d.cfg.CgroupParent)); !os.IsNotExist(err) {
			d.bestEffort(ctx, "uninstall: remove the cgroup parent", err)
		}
	}
	errs = append(errs, os.RemoveAll(d.cfg.RunDir))
	if purge {
		errs = append(errs, os.RemoveAll(d.cfg.StateDir))
	}
	return errors.Join(errs...)
}

// unmountBundles unmounts what is left below the bundles directory, and
// the runsc view's boundary on it (a bind of the directory onto itself,
// left by a Close while sandboxes were mounted below it, or by a crash);
// another mount there (a disk of its own) stays.
func (d *Daemon) unmountBundles(ctx context.Context) error {
	dir := d.bundlesDir()
	if p, err := filepath.EvalSymlinks(dir); err == nil {
		dir = p
	}
	mps, err := mount.Under(dir)
	if err != nil {
		return err
	}
	var errs []error
	for _, mp := range mps {
		if mp != dir {
			errs = append(errs, mount.Unmount(ctx, mp))
		}
	}
	for range 4 { // the boundary, and any stacked on it
		infos, err := mount.List()
		if err != nil {
			return errors.Join(append(errs, err)...)
		}
		in := mount.Top(infos, dir)
		if in == nil || !mount.SelfBind(infos, *in) {
			break
		}
		if err := mount.Unmount(ctx, dir); err != nil {
			return errors.Join(append(errs, err)...)
		}
	}
	return errors.Join(errs...)
}
