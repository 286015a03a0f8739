// Cgroup hybrid mode: starting crun in a private mount namespace that does
// not have the cgroup2 hierarchy.

package crun

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/runtime/ocicli"
)

const cgroupRoot = "/sys/fs/cgroup"

// detectHybrid returns the mount point of the cgroup2 hierarchy crun must
// not see, or "" when crun can run directly.
//
// crun (checked with 1.8.1) reads the cgroup mode the way libcrun does:
// cgroup2 at /sys/fs/cgroup is "unified", tmpfs there is "legacy" unless
// /sys/fs/cgroup/unified is a cgroup2 mount, which makes it "hybrid"; and it
// refuses hybrid mode when the v2 hierarchy has any controller ("cgroups in
// hybrid mode not supported, drop all controllers from cgroupv2"). Hosts
// like ours have v1 controllers plus a v2 hierarchy holding only hugetlb
// (the one controller no v1 hierarchy claims). forkbox sets no hugetlb
// limits, so hiding the v2 hierarchy from crun loses nothing: crun then sees
// a legacy host and puts the container in the v1 controllers, where every
// limit forkbox sets lives. We hide it whenever the host is hybrid, even
// with no v2 controller, so the behaviour does not depend on crun's version.
func detectHybrid(root string) (string, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(root, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return "", nil
		}
		return "", fmt.Errorf("crun: statfs %s: %v: %w", root, err, errdefs.ErrInternal)
	}
	if st.Type != unix.TMPFS_MAGIC {
		return "", nil // cgroup2 (unified) or something crun will judge itself
	}
	unified := filepath.Join(root, "unified")
	if err := unix.Statfs(unified, &st); err != nil || st.Type != unix.CGROUP2_SUPER_MAGIC {
		return "", nil // pure v1
	}
	if b, err := os.ReadFile(filepath.Join(unified, "cgroup.controllers")); err == nil {
		for _, ctl := range strings.Fields(string(b)) {
			switch ctl {
			case "memory", "cpu", "pids", "cpuset", "io":
				// Such a controller is not in v1 then; crun in legacy mode
				// cannot set its limit and will say so at run.
				return "", fmt.Errorf("crun: cgroup2 at %s holds the %s controller; hybrid hosts must keep forkbox's controllers in v1: %w",
					unified, ctl, errdefs.ErrUnavailable)
			}
		}
	}
	return unified, nil
}

// start starts cmd. On a hybrid host it does so from a fresh OS thread
// that first moves into a new mount namespace, makes it private (so the
// unmount does not propagate to the host) and detaches the cgroup2 mount;
// the crun process inherits that namespace. This is the Go form of
// `unshare -m --propagation private sh -c 'umount UNIFIED && exec crun ...'`
// without a shell, a helper binary or a re-exec of our own binary:
//   - a new namespace per command (not one long-lived one) so crun always
//     sees the host's current mounts, including the sandbox's rootfs and
//     netns files mounted a moment ago; the cost is one unshare (~0.1 ms);
//   - the thread stays locked and is never unlocked, so Go ends it when the
//     goroutine returns and no other goroutine runs in that namespace; the
//     Go runtime (≥1.10) creates no new threads from a locked thread;
//   - that thread is never the process's main thread (see onOtherThread):
//     Go cannot end the main thread, it parks it for good, and the main
//     thread is what /proc/self names, so a private namespace left on it
//     would be the mount table every later reader of /proc/self/mountinfo
//     sees: a stale one, with rootfs mounts the host has long unmounted.
//
// Everything else is shared with the host: crun's --root is on an ordinary
// file system, and the cgroup v1 hierarchies and /proc are the host's.
func (c *Crun) start(cmd *exec.Cmd) error {
	if c.hybrid == "" {
		return cmd.Start()
	}
	return onOtherThread(func() error {
		if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
			return fmt.Errorf("crun: unshare mount namespace: %v: %w", err, errdefs.ErrInternal)
		}
		if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
			return fmt.Errorf("crun: make mount namespace private: %v: %w", err, errdefs.ErrInternal)
		}
		if err := unix.Unmount(c.hybrid, unix.MNT_DETACH); err != nil {
			return fmt.Errorf("crun: hide %s: %v: %w", c.hybrid, err, errdefs.ErrInternal)
		}
		return cmd.Start()
	})
}

// onOtherThread and lockedOffMain are ocicli's (shared with the runsc
// driver's view).
var (
	onOtherThread = ocicli.OnOtherThread
	lockedOffMain = ocicli.LockedOffMain
)
