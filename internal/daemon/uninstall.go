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
	// What is left below the run dir, and below the bundles (the runsc
	// view's boundary, kept by Close while a sandbox was still mounted).
	for _, dir := range []string{d.cfg.RunDir, d.bundlesDir()} {
		if mps, err := mount.Under(dir); err == nil {
			for _, mp := range mps {
				errs = append(errs, mount.Unmount(ctx, mp))
			}
		}
	}
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
