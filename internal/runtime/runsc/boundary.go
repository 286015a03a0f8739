package runsc

// Boundaries: each hidden directory a mount point of its own on the host,
// so that the view can follow the host's mounts (a slave of them: a file
// system the host unmounts leaves the view too, instead of staying busy
// until the daemon stops) while the sandboxes' mounts made below the
// hidden directories later still stay out of it. The view cuts each
// boundary's copy from the host's propagation; a directory that is no
// mount point has nothing to cut, so the host needs the bind.
//
// A boundary the view makes is a private bind of the directory onto
// itself. Private, because a bind of a directory of a shared mount joins
// that mount's peer group: the sandbox mounts below it would propagate to
// the parent's peers and slaves, the view's copy of the parent among them
// (and a second, shadowed copy onto the parent on the host itself). So
// sandbox mounts below a boundary propagate nowhere: where they must (a
// Kubernetes node's Bidirectional state volume carries them to the host,
// where the next pod finds them), the daemon asks for no boundary
// (Options.SharedHidden) and the view is a private copy. A boundary
// outlives the daemon while sandboxes are mounted below it (they outlive
// the daemon too), a later start reuses it, and a Close that finds nothing
// below it unmounts it. Only a private bind of the directory onto itself
// is unmounted: the shared netns directory (the network's), or a disk an
// admin mounted there, is left alone.

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/mount"
)

// makeBoundaries makes each of dirs (resolved, existing) a mount point on
// the calling thread's namespace, the host's, unless it is one. It reports
// false, making none, when one of them has mounts below it and is no
// mount point (sandboxes of an earlier version that made no boundary):
// the view cannot follow the host then.
func makeBoundaries(dirs []string) (bool, error) {
	infos, err := mount.List()
	if err != nil {
		return false, fmt.Errorf("runsc view: %v: %w", err, errdefs.ErrInternal)
	}
	var todo []string
	for _, d := range dirs {
		if mountAt(infos, d) != nil {
			continue
		}
		if hasBelow(infos, d) {
			return false, nil
		}
		todo = append(todo, d)
	}
	for i, d := range todo {
		err := unix.Mount(d, d, "", unix.MS_BIND, "")
		if err == nil {
			if err = unix.Mount("", d, "", unix.MS_PRIVATE, ""); err != nil {
				_ = unix.Unmount(d, unix.MNT_DETACH)
			}
		}
		if err != nil {
			for _, done := range todo[:i] {
				_ = unix.Unmount(done, unix.MNT_DETACH)
			}
			return false, fmt.Errorf("runsc view: make %s a mount point: %v: %w", d, err, errdefs.ErrInternal)
		}
	}
	return true, nil
}

// releaseBoundaries unmounts, of dirs, those that are a boundary as
// makeBoundaries makes them (a private bind of the directory onto itself)
// with nothing mounted below. Another mount on a directory (a disk an
// admin mounted there, the shared netns directory) is left alone.
func releaseBoundaries(dirs []string) error {
	infos, err := mount.List()
	if err != nil {
		return fmt.Errorf("runsc view: %v: %w", err, errdefs.ErrInternal)
	}
	var errs []error
	for _, d := range dirs {
		in := mountAt(infos, d)
		if in == nil || in.Shared || hasBelow(infos, d) || !selfBind(infos, *in) {
			continue
		}
		if err := unix.Unmount(d, 0); err != nil && !errors.Is(err, unix.EINVAL) {
			errs = append(errs, fmt.Errorf("runsc view: unmount the boundary %s: %v: %w", d, err, errdefs.ErrInternal))
		}
	}
	return errors.Join(errs...)
}

// mountAt returns the topmost mount on path, or nil.
func mountAt(infos []mount.Info, path string) *mount.Info {
	for i := len(infos) - 1; i >= 0; i-- {
		if infos[i].Mountpoint == path {
			return &infos[i]
		}
	}
	return nil
}

// hasBelow reports whether anything is mounted strictly below path.
func hasBelow(infos []mount.Info, path string) bool {
	for _, in := range infos {
		if strings.HasPrefix(in.Mountpoint, path+"/") {
			return true
		}
	}
	return false
}

// selfBind reports whether in binds its own directory of its parent's file
// system onto itself, as makeBoundaries does.
func selfBind(infos []mount.Info, in mount.Info) bool {
	for _, p := range infos {
		if p.ID != in.Parent {
			continue
		}
		rel, err := filepath.Rel(p.Mountpoint, in.Mountpoint)
		return err == nil && !strings.HasPrefix(rel, "..") && p.Source == in.Source && p.FSType == in.FSType &&
			filepath.Join(p.Root, rel) == in.Root
	}
	return false
}

// existing returns dirs after creating those missing (private to root, as
// the daemon makes its own), so that each can be a mount point.
func existing(dirs []string) ([]string, error) {
	for _, d := range dirs {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("runsc view: %v: %w", err, errdefs.ErrInternal)
		}
	}
	return resolved(dirs), nil
}
