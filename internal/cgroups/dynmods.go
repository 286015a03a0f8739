package cgroups

import (
	"fmt"
	"os"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/mount"
)

// The kernel's "favordynmods" cgroup option, and what it does for sandbox
// starts (the daemon turns it on with serve --cgroup-favordynmods).
//
// Moving a process into a cgroup (a write to cgroup.procs) write-locks
// cgroup_threadgroup_rwsem, a per-CPU rwsem whose readers are every fork
// and exit on the host. Without favordynmods that lock waits for an RCU
// grace period each time it is taken after a quiet spell: on this 2-core
// host a join and leave of 4 v1 controllers, 50 ms apart, took 5.8 ms p50
// (0.10 ms back to back), and the grace period lengthens as the host gets
// busier. Every runtime start moves processes: runsc joins the sandbox's
// cgroup on v1 (it cannot clone into it) and crun writes its container's
// pid, so a gVisor create paid it several times, and at 1,000 live
// sandboxes runsc's cgroup joins took 26-35 ms of a create against 13-19
// with 5 live. With favordynmods the same join and leave took 0.26 ms p50.
//
// favordynmods keeps the rwsem's readers on their slow path (fork and exit
// cost a little more) and, from Linux 6.18, locks cgroup.procs writes per
// thread group instead. The option lives on the cgroup2 hierarchy but the
// lock is shared by v1 hierarchies too, so a remount of the cgroup2 mount
// helps hybrid hosts (v1 controllers, a v2 mount) as well. From 6.18 it is
// one-way: a remount without it clears the flag but the per-thread-group
// locking stays until reboot.
//
// What it saves in joins it gives back in forks and exits here: gVisor
// create + first exec p50 was 128 and 142 ms before the switch and 119-144
// with it on (five runs), so it is opt-in.

// FavorDynModsOption is the cgroup2 mount option.
const FavorDynModsOption = "favordynmods"

// FavorDynMods switches favordynmods on by reconfiguring the host's cgroup2
// superblock (fspick + fsconfig: the mount's own flags, such as nosuid,
// are not touched, and its other superblock options are set again as they
// were, since a cgroup2 reconfigure applies its whole option set). It
// returns the cgroup2 mount point and whether it changed anything.
//
// NotImplemented: the kernel has no favordynmods (before Linux 6.0).
// NotFound: no cgroup2 hierarchy is mounted (a pure v1 host: boot it with
// cgroup_favordynmods=true instead). FailedPrecondition: the reconfigure
// was accepted but the option is not on (the caller is not in the initial
// cgroup namespace, where the kernel ignores root options).
func FavorDynMods() (mountpoint string, changed bool, err error) {
	features, err := os.ReadFile("/sys/kernel/cgroup/features")
	if err != nil || !slices.Contains(strings.Fields(string(features)), FavorDynModsOption) {
		return "", false, fmt.Errorf("cgroup: this kernel has no %s option: %w", FavorDynModsOption, errdefs.ErrNotImplemented)
	}
	m, err := cgroup2Mount()
	if err != nil {
		return "", false, err
	}
	if slices.Contains(superOptions(m), FavorDynModsOption) {
		return m.Mountpoint, false, nil
	}
	if err := reconfigure(m.Mountpoint, withFavorDynMods(m)); err != nil {
		return m.Mountpoint, false, err
	}
	if after, err := cgroup2Mount(); err != nil {
		return m.Mountpoint, true, err
	} else if !slices.Contains(superOptions(after), FavorDynModsOption) {
		return m.Mountpoint, true, fmt.Errorf("cgroup: %s reconfigured but %s is not on (not in the initial cgroup namespace?): %w",
			m.Mountpoint, FavorDynModsOption, errdefs.ErrFailedPrecondition)
	}
	return m.Mountpoint, true, nil
}

// cgroup2Mount returns the host's cgroup2 mount: /sys/fs/cgroup on a
// unified host, /sys/fs/cgroup/unified on a hybrid one.
func cgroup2Mount() (mount.Info, error) {
	ms, err := mount.List()
	if err != nil {
		return mount.Info{}, fmt.Errorf("cgroup: %v: %w", err, errdefs.ErrInternal)
	}
	for _, m := range ms {
		if m.FSType == "cgroup2" && m.Root == "/" {
			return m, nil
		}
	}
	return mount.Info{}, fmt.Errorf("cgroup: no cgroup2 hierarchy mounted: %w", errdefs.ErrNotFound)
}

// superOptions returns m's superblock options that a reconfigure sets: all
// but rw/ro, which the reconfigure leaves as they are when not named.
func superOptions(m mount.Info) []string {
	var out []string
	for _, o := range strings.Split(m.SuperOptions, ",") {
		if o != "" && o != "rw" && o != "ro" {
			out = append(out, o)
		}
	}
	return out
}

// withFavorDynMods is the option set that switches favordynmods on and
// keeps the rest of m's: a daemon that reads the options while another
// switches it on writes the same set back, so concurrent daemons agree.
func withFavorDynMods(m mount.Info) []string {
	opts := slices.DeleteFunc(superOptions(m), func(o string) bool { return o == FavorDynModsOption })
	return append(opts, FavorDynModsOption)
}

// reconfigure sets opts (flags, or key=value) on the superblock mounted at
// mountpoint and applies them.
func reconfigure(mountpoint string, opts []string) error {
	fd, err := unix.Fspick(unix.AT_FDCWD, mountpoint, unix.FSPICK_CLOEXEC|unix.FSPICK_NO_AUTOMOUNT)
	if err != nil {
		return fmt.Errorf("cgroup: fspick %s: %v: %w", mountpoint, err, errdefs.ErrInternal)
	}
	defer unix.Close(fd)
	for _, o := range opts {
		if k, v, ok := strings.Cut(o, "="); ok {
			err = unix.FsconfigSetString(fd, k, v)
		} else {
			err = unix.FsconfigSetFlag(fd, o)
		}
		if err != nil {
			return fmt.Errorf("cgroup: %s: option %s: %v: %w", mountpoint, o, err, errdefs.ErrInternal)
		}
	}
	if err := unix.FsconfigReconfigure(fd); err != nil {
		return fmt.Errorf("cgroup: reconfigure %s: %v: %w", mountpoint, err, errdefs.ErrInternal)
	}
	return nil
}
