package network

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/mount"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// ensureNetnsDir creates dir and makes it a shared mount point, the way
// `ip netns` does for /run/netns, so that a netns bind mount made or removed
// here propagates into mount namespaces copied from ours later (a runtime's),
// and unmounting it in Teardown really releases the namespace. With
// ownGroup, dir leaves the peer group of the mount it is on (which a bind
// of a directory of a shared mount joins, as an earlier version's did) for
// one of its own, unless netns files are mounted in it already: they then
// propagate into the copies made of dir, and not into every copy and peer
// of its parent's mount.
func ensureNetnsDir(dir string, ownGroup bool) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("network: create %s: %v: %w", dir, err, errdefs.ErrInternal)
	}
	err := unix.Mount("", dir, "none", unix.MS_SHARED|unix.MS_REC, "")
	regroup := ownGroup
	if errors.Is(err, unix.EINVAL) { // not a mount point yet
		if err := unix.Mount(dir, dir, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("network: bind mount %s: %v: %w", dir, err, errdefs.ErrInternal)
		}
		err = unix.Mount("", dir, "none", unix.MS_SHARED|unix.MS_REC, "")
	} else if err == nil && ownGroup {
		// A mount point already: one an earlier version bound in its
		// parent's peer group moves to a group of its own, unless netns
		// files are mounted in it (leaving would strand their copies on
		// the parent, each holding its namespace).
		infos, lerr := mount.List()
		if lerr != nil {
			return fmt.Errorf("network: %v: %w", lerr, errdefs.ErrInternal)
		}
		in := mount.Top(infos, dir)
		regroup = in != nil && mount.GroupShared(infos, *in) && !mount.HasBelow(infos, dir)
	}
	if err == nil && regroup {
		// Out of the group it joined (a bind of a directory of a shared
		// mount joins that mount's group), into one of its own.
		if err = unix.Mount("", dir, "none", unix.MS_PRIVATE, ""); err == nil {
			err = unix.Mount("", dir, "none", unix.MS_SHARED, "")
		}
	}
	if err != nil {
		return fmt.Errorf("network: make %s shared: %v: %w", dir, err, errdefs.ErrInternal)
	}
	return nil
}

// releaseNetnsDir unmounts dir's self bind mount, if it is a mount point.
func releaseNetnsDir(dir string) error {
	mounted, err := isMountPoint(dir)
	if err != nil || !mounted {
		return err
	}
	if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("network: unmount %s: %v: %w", dir, err, errdefs.ErrInternal)
	}
	return nil
}

// isMountPoint reports whether path is a mount point in our mount namespace.
func isMountPoint(path string) (bool, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return false, err
	}
	f, err := os.Open("/proc/thread-self/mountinfo")
	if err != nil {
		return false, fmt.Errorf("network: %v: %w", err, errdefs.ErrInternal)
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	s.Buffer(make([]byte, 64<<10), 1<<20)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) > 4 && unescapeMountPath(fields[4]) == abs {
			return true, nil
		}
	}
	return false, s.Err()
}

// unescapeMountPath undoes mountinfo's octal escapes (\040 for space, ...).
func unescapeMountPath(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var v int
			if _, err := fmt.Sscanf(s[i+1:i+4], "%03o", &v); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// createNetns creates a new network namespace and bind-mounts it on path,
// which must not exist. It returns ErrAlreadyExists if it does.
func createNetns(path string) error {
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if errors.Is(err, os.ErrExist) {
		return fmt.Errorf("network: netns %s: %w", path, errdefs.ErrAlreadyExists)
	}
	if err != nil {
		return fmt.Errorf("network: create %s: %v: %w", path, err, errdefs.ErrInternal)
	}
	f.Close()
	if err := mountNetns(path); err != nil {
		os.Remove(path)
		return err
	}
	return nil
}

// KeepPlace makes sandbox id's netns file again where it is missing: the
// place of a sandbox that holds no network (a hibernated one, Detach),
// kept in the run directory, which a host's reboot empties (/run is a
// tmpfs). Attach then gives it its network again; before, every wake of
// it was NotFound.
func (m *Manager) KeepPlace(id string) error {
	if err := validID(id); err != nil {
		return err
	}
	f, err := os.OpenFile(m.NSPath(id), os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if errors.Is(err, os.ErrExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("network: netns file of %s: %v: %w", id, err, errdefs.ErrInternal)
	}
	return f.Close()
}

// mountNetns creates a new network namespace and bind-mounts it on path,
// an existing file.
func mountNetns(path string) error {
	// unshare(CLONE_NEWNET) changes the calling thread only. Do it on a
	// locked thread of a goroutine of our own; if the thread cannot be put
	// back into the original namespace, it stays locked and the runtime
	// destroys it when the goroutine returns.
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("network: open current netns: %v: %w", err, errdefs.ErrInternal)
			return
		}
		defer orig.Close()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("network: unshare netns: %v: %w", err, errdefs.ErrInternal)
			return
		}
		src := fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid())
		mErr := unix.Mount(src, path, "none", unix.MS_BIND, "")
		if err := netns.Set(orig); err != nil {
			errc <- fmt.Errorf("network: restore netns: %v: %w", err, errdefs.ErrInternal)
			return // thread stays locked and dies with this goroutine
		}
		runtime.UnlockOSThread()
		if mErr != nil {
			mErr = fmt.Errorf("network: bind mount netns on %s: %v: %w", path, mErr, errdefs.ErrInternal)
		}
		errc <- mErr
	}()
	return <-errc
}

// netnsMounted reports whether a network namespace is mounted on path (an
// existing file).
func netnsMounted(path string) (bool, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return false, fmt.Errorf("network: statfs %s: %v: %w", path, err, errdefs.ErrInternal)
	}
	return st.Type == unix.NSFS_MAGIC, nil
}

// unmountNetns unmounts the netns on path, keeping the file; with no
// process in it, the namespace goes. Not mounted is fine.
func unmountNetns(path string) error {
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("network: unmount %s: %v: %w", path, err, errdefs.ErrInternal)
	}
	return nil
}

// removeNetns unmounts and removes the netns file at path. Missing is fine.
func removeNetns(path string) error {
	if err := unmountNetns(path); err != nil {
		return err
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("network: remove %s: %v: %w", path, err, errdefs.ErrInternal)
	}
	return nil
}
