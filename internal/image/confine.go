package image

import (
	"errors"
	"fmt"
	"os"
	"path"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/errdefs"
)

// layerRoot is an open layer directory. Every path below it is resolved by
// the kernel with openat2(RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS|...), or
// component by component with O_NOFOLLOW where openat2 is missing, so no
// symlink, ".." or mount point met on the way can lead outside: a parent
// that is not a real directory inside the layer is an InvalidArgument
// error. Operations then act on one name relative to its parent's fd.
type layerRoot struct {
	fd   int      // O_PATH fd of the layer directory
	root *os.Root // the same directory, for RemoveAll
}

func openLayerRoot(dir string) (*layerRoot, error) {
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open layer dir: %v: %w", err, errdefs.ErrInternal)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("open layer dir: %v: %w", err, errdefs.ErrInternal)
	}
	return &layerRoot{fd: fd, root: root}, nil
}

func (r *layerRoot) Close() error {
	unix.Close(r.fd)
	return r.root.Close()
}

// useOpenat2 is false only in tests of the fallback walk.
var useOpenat2 = true

const resolveFlags = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV

// openDir opens the directory rel ("." is the root) as an O_PATH fd, or
// creates it and its missing parents (mode 0755) when create is set.
func (r *layerRoot) openDir(rel string, create bool) (int, error) {
	if useOpenat2 {
		fd, err := unix.Openat2(r.fd, rel, &unix.OpenHow{
			Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
			Resolve: resolveFlags,
		})
		if err == nil {
			return fd, nil
		}
		if !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.ENOSYS) {
			return -1, dirErr(rel, err)
		}
	}
	// Missing (or no openat2): walk it one component at a time.
	cur, err := unix.Dup(r.fd)
	if err != nil {
		return -1, fmt.Errorf("dup: %v: %w", err, errdefs.ErrInternal)
	}
	if rel == "." {
		return cur, nil
	}
	for _, c := range strings.Split(rel, "/") {
		if c == "" || c == "." || c == ".." {
			unix.Close(cur)
			return -1, fmt.Errorf("directory %q: bad component %q: %w", rel, c, errdefs.ErrInvalidArgument)
		}
		next, err := unix.Openat(cur, c, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if errors.Is(err, unix.ENOENT) && create {
			if err = unix.Mkdirat(cur, c, 0o755); err == nil || errors.Is(err, unix.EEXIST) {
				next, err = unix.Openat(cur, c, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			}
		}
		unix.Close(cur)
		if err != nil {
			return -1, dirErr(rel, err)
		}
		cur = next
	}
	return cur, nil
}

// dirErr classifies a failure to resolve a directory inside the layer.
func dirErr(rel string, err error) error {
	switch {
	case errors.Is(err, unix.ELOOP), errors.Is(err, unix.ENOTDIR), errors.Is(err, unix.EXDEV), errors.Is(err, unix.EAGAIN):
		return fmt.Errorf("%q is not a directory inside the layer: %w", rel, errdefs.ErrInvalidArgument)
	case errors.Is(err, unix.ENOENT):
		return fmt.Errorf("directory %q does not exist: %w", rel, errdefs.ErrInvalidArgument)
	case errors.Is(err, unix.ENAMETOOLONG):
		return fmt.Errorf("directory %q: name too long: %w", rel, errdefs.ErrInvalidArgument)
	}
	return fmt.Errorf("open directory %q: %v: %w", rel, err, errdefs.ErrInternal)
}

// parent opens the directory that holds rel (rel is not "."), creating it
// when create is set, and returns its fd and rel's last component.
func (r *layerRoot) parent(rel string, create bool) (int, string, error) {
	fd, err := r.openDir(path.Dir(rel), create)
	return fd, path.Base(rel), err
}

// lstat is fstatat(AT_SYMLINK_NOFOLLOW) of name in dirfd; ok is false when
// nothing is there.
func lstatAt(dirfd int, name string) (st unix.Stat_t, ok bool, err error) {
	err = unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW)
	if errors.Is(err, unix.ENOENT) {
		return st, false, nil
	}
	if err != nil {
		return st, false, fmt.Errorf("stat %s: %v: %w", name, err, errdefs.ErrInternal)
	}
	return st, true, nil
}

// removeAll removes rel (not ".") and everything below it, without
// following symlinks.
func (r *layerRoot) removeAll(rel string) error {
	if err := r.root.RemoveAll(rel); err != nil {
		return fmt.Errorf("remove %s: %v: %w", rel, err, errdefs.ErrInternal)
	}
	return nil
}
