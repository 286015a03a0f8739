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

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/mount"
)

// makeBoundaries makes each of dirs (resolved, existing) a mount point on
// the calling thread's namespace, the host's, unless it is one already,
// and returns those it made. It reports false, making none, when one of
// them would let the sandbox mounts below it reach the view:
//   - a directory with mounts below it and no mount point (sandboxes of an
//     earlier version that made no boundary);
//   - a mount point in a peer group with another mount of the host (the
//     netns directory an earlier version bound in its parent's group):
//     every mount below it is copied onto that one, and so into the view's
//     copy of it;
//   - a directory whose bind is copied onto another mount as well (an
//     ancestor bound onto itself in its parent's peer group).
//
// The view cannot follow the host then, and is a private copy.
func makeBoundaries(dirs []string) (made []string, ok bool, err error) {
	infos, err := mount.List()
	if err != nil {
		return nil, false, fmt.Errorf("runsc view: %v: %w", err, errdefs.ErrInternal)
	}
	var todo []string
	for _, d := range dirs {
		if in := mount.Top(infos, d); in != nil {
			if mount.GroupShared(infos, *in) {
				return nil, false, nil
			}
			continue
		}
		if mount.HasBelow(infos, d) {
			return nil, false, nil
		}
		todo = append(todo, d)
	}
	for _, d := range todo {
		ok, err := bindPrivate(d)
		if err != nil || !ok {
			_ = releaseBoundaries(made)
			return nil, false, err
		}
		made = append(made, d)
	}
	return made, true, nil
}

// bindPrivate binds d onto itself and makes the bind private. When the
// bind was copied onto another mount too (its parent is in a peer group
// with a mount that covers d, hidden below), it unmounts the bind again
// while it still is in that group, which takes the copies along, and
// reports false.
func bindPrivate(d string) (bool, error) {
	at := func() int {
		infos, _ := mount.List()
		return mount.CountAt(infos, d)
	}
	before := at()
	if err := unix.Mount(d, d, "", unix.MS_BIND, ""); err != nil {
		return false, fmt.Errorf("runsc view: make %s a mount point: %v: %w", d, err, errdefs.ErrInternal)
	}
	if at() > before+1 {
		if err := unix.Unmount(d, 0); err != nil {
			return false, fmt.Errorf("runsc view: unmount the bind of %s, copied onto another mount: %v: %w", d, err, errdefs.ErrInternal)
		}
		return false, nil
	}
	if err := unix.Mount("", d, "", unix.MS_PRIVATE, ""); err != nil {
		_ = unix.Unmount(d, unix.MNT_DETACH)
		return false, fmt.Errorf("runsc view: make %s a mount point: %v: %w", d, err, errdefs.ErrInternal)
	}
	return true, nil
}

// releaseBoundaries unmounts, of dirs, those that are a boundary as
// bindPrivate makes them (a private bind of the directory onto itself),
// with nothing mounted below. Another mount on a directory (a disk an
// admin mounted there, the shared netns directory) is left alone.
func releaseBoundaries(dirs []string) error {
	infos, err := mount.List()
	if err != nil {
		return fmt.Errorf("runsc view: %v: %w", err, errdefs.ErrInternal)
	}
	var errs []error
	for _, d := range dirs {
		in := mount.Top(infos, d)
		if in == nil || in.Shared() || mount.HasBelow(infos, d) || !mount.SelfBind(infos, *in) {
			continue
		}
		if err := unix.Unmount(d, 0); err != nil && !errors.Is(err, unix.EINVAL) {
			errs = append(errs, fmt.Errorf("runsc view: unmount the boundary %s: %v: %w", d, err, errdefs.ErrInternal))
		}
	}
	return errors.Join(errs...)
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
