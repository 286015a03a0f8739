package image

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/errdefs"
)

const (
	whiteoutPrefix = ".wh."
	whiteoutOpaque = ".wh..wh..opq"
	whiteoutMeta   = ".wh..wh."
)

// unpacker writes one layer's tar stream into dir, converting OCI whiteouts
// to overlayfs ones. It refuses entries that would land outside dir, either
// by their name or through a symlink in their parent path.
type unpacker struct {
	dir   string
	dirs  map[string]bool // relative paths known to be real directories
	times []dirTime
	buf   []byte
}

type dirTime struct {
	path  string
	mtime time.Time
}

// unpackTar unpacks r into dir, which must exist and be empty.
func unpackTar(ctx context.Context, r io.Reader, dir string) error {
	u := &unpacker{dir: dir, dirs: map[string]bool{".": true}, buf: make([]byte, 256<<10)}
	tr := tar.NewReader(r)
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("read layer tar: %v: %w", err, errdefs.ErrInvalidArgument)
		}
		if err := u.entry(hdr, tr); err != nil {
			return fmt.Errorf("layer entry %q: %w", hdr.Name, err)
		}
	}
	// Directory mtimes last: creating children changed them.
	for i := len(u.times) - 1; i >= 0; i-- {
		t := u.times[i]
		ts := []unix.Timespec{unix.NsecToTimespec(t.mtime.UnixNano()), unix.NsecToTimespec(t.mtime.UnixNano())}
		_ = unix.UtimesNanoAt(unix.AT_FDCWD, t.path, ts, unix.AT_SYMLINK_NOFOLLOW)
	}
	return nil
}

// clean validates a tar entry name and returns it relative to the layer root.
func clean(n string) (string, error) {
	if filepath.IsAbs(n) {
		return "", fmt.Errorf("absolute path: %w", errdefs.ErrInvalidArgument)
	}
	for _, part := range strings.Split(n, "/") {
		if part == ".." {
			return "", fmt.Errorf("path escapes the layer: %w", errdefs.ErrInvalidArgument)
		}
	}
	return filepath.Clean(n), nil
}

// parent makes sure every directory above rel exists inside the layer and is
// a real directory, not a symlink that could lead out of it.
func (u *unpacker) parent(rel string) error {
	p := filepath.Dir(rel)
	if u.dirs[p] {
		return nil
	}
	if err := u.parent(p); err != nil {
		return err
	}
	abs := filepath.Join(u.dir, p)
	fi, err := os.Lstat(abs)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if err := os.Mkdir(abs, 0o755); err != nil {
			return fmt.Errorf("mkdir %s: %v: %w", p, err, errdefs.ErrInternal)
		}
	case err != nil:
		return fmt.Errorf("stat %s: %v: %w", p, err, errdefs.ErrInternal)
	case !fi.IsDir():
		return fmt.Errorf("parent %q is not a directory: %w", p, errdefs.ErrInvalidArgument)
	}
	u.dirs[p] = true
	return nil
}

func (u *unpacker) entry(hdr *tar.Header, r io.Reader) error {
	rel, err := clean(hdr.Name)
	if err != nil {
		return err
	}
	if err := u.parent(rel); err != nil {
		return err
	}
	base := filepath.Base(rel)
	abs := filepath.Join(u.dir, rel)
	// Whiteouts.
	if base == whiteoutOpaque {
		if err := unix.Lsetxattr(filepath.Dir(abs), "trusted.overlay.opaque", []byte("y"), 0); err != nil {
			return fmt.Errorf("set opaque xattr: %v: %w", err, errdefs.ErrInternal)
		}
		return nil
	}
	if strings.HasPrefix(base, whiteoutMeta) {
		return nil // other AUFS metadata (.wh..wh.plnk, ...): not needed
	}
	if strings.HasPrefix(base, whiteoutPrefix) {
		target := filepath.Join(filepath.Dir(abs), strings.TrimPrefix(base, whiteoutPrefix))
		if err := u.replace(target, false); err != nil {
			return err
		}
		if err := unix.Mknod(target, unix.S_IFCHR, 0); err != nil {
			return fmt.Errorf("mknod whiteout: %v: %w", err, errdefs.ErrInternal)
		}
		return nil
	}
	if rel == "." {
		if hdr.Typeflag == tar.TypeDir {
			return u.attrs(hdr, abs)
		}
		return nil
	}

	switch hdr.Typeflag {
	case tar.TypeDir:
		if err := u.replace(abs, true); err != nil {
			return err
		}
		if err := os.Mkdir(abs, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("mkdir: %v: %w", err, errdefs.ErrInternal)
		}
		u.dirs[rel] = true
	case tar.TypeReg, tar.TypeRegA:
		if err := u.replace(abs, false); err != nil {
			return err
		}
		f, err := os.OpenFile(abs, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return fmt.Errorf("create: %v: %w", err, errdefs.ErrInternal)
		}
		_, err = io.CopyBuffer(f, r, u.buf)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("write: %v: %w", err, errdefs.ErrInvalidArgument)
		}
	case tar.TypeSymlink:
		if err := u.replace(abs, false); err != nil {
			return err
		}
		if err := os.Symlink(hdr.Linkname, abs); err != nil {
			return fmt.Errorf("symlink: %v: %w", err, errdefs.ErrInternal)
		}
	case tar.TypeLink:
		lrel, err := clean(hdr.Linkname)
		if err != nil {
			return fmt.Errorf("hardlink target: %w", err)
		}
		if err := u.parent(lrel); err != nil {
			return err
		}
		src := filepath.Join(u.dir, lrel)
		if fi, err := os.Lstat(src); err != nil || fi.IsDir() {
			return fmt.Errorf("hardlink target %q missing or a directory: %w", hdr.Linkname, errdefs.ErrInvalidArgument)
		}
		if err := u.replace(abs, false); err != nil {
			return err
		}
		if err := os.Link(src, abs); err != nil {
			return fmt.Errorf("hardlink: %v: %w", err, errdefs.ErrInternal)
		}
		return nil // shares the target's inode and attributes
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		if err := u.replace(abs, false); err != nil {
			return err
		}
		mode := uint32(unix.S_IFIFO)
		switch hdr.Typeflag {
		case tar.TypeChar:
			mode = unix.S_IFCHR
		case tar.TypeBlock:
			mode = unix.S_IFBLK
		}
		dev := unix.Mkdev(uint32(hdr.Devmajor), uint32(hdr.Devminor))
		if err := unix.Mknod(abs, mode|uint32(hdr.Mode&0o7777), int(dev)); err != nil {
			return fmt.Errorf("mknod: %v: %w", err, errdefs.ErrInternal)
		}
	case tar.TypeXGlobalHeader:
		return nil
	default:
		return nil // unknown types are skipped, like containerd does
	}
	return u.attrs(hdr, abs)
}

// replace removes whatever is at abs unless both it and the new entry are
// directories (a directory entry over an existing one just updates it).
func (u *unpacker) replace(abs string, newIsDir bool) error {
	fi, err := os.Lstat(abs)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("stat: %v: %w", err, errdefs.ErrInternal)
	}
	if fi.IsDir() && newIsDir {
		return nil
	}
	if fi.IsDir() {
		u.dirs = map[string]bool{".": true} // forget paths below it
	}
	if err := os.RemoveAll(abs); err != nil {
		return fmt.Errorf("replace: %v: %w", err, errdefs.ErrInternal)
	}
	return nil
}

// attrs applies ownership, mode, xattrs and times from hdr to abs.
func (u *unpacker) attrs(hdr *tar.Header, abs string) error {
	if err := os.Lchown(abs, hdr.Uid, hdr.Gid); err != nil {
		return fmt.Errorf("chown: %v: %w", err, errdefs.ErrInternal)
	}
	for k, v := range hdr.PAXRecords {
		if x, ok := strings.CutPrefix(k, "SCHILY.xattr."); ok {
			// Best effort: the filesystem may not support every namespace.
			_ = unix.Lsetxattr(abs, x, []byte(v), 0)
		}
	}
	if hdr.Typeflag == tar.TypeSymlink {
		ts := []unix.Timespec{unix.NsecToTimespec(hdr.ModTime.UnixNano()), unix.NsecToTimespec(hdr.ModTime.UnixNano())}
		_ = unix.UtimesNanoAt(unix.AT_FDCWD, abs, ts, unix.AT_SYMLINK_NOFOLLOW)
		return nil
	}
	// After chown, which clears set-id bits.
	if err := unix.Chmod(abs, uint32(hdr.Mode&0o7777)); err != nil {
		return fmt.Errorf("chmod: %v: %w", err, errdefs.ErrInternal)
	}
	if hdr.Typeflag == tar.TypeDir {
		u.times = append(u.times, dirTime{abs, hdr.ModTime})
		return nil
	}
	ts := []unix.Timespec{unix.NsecToTimespec(hdr.ModTime.UnixNano()), unix.NsecToTimespec(hdr.ModTime.UnixNano())}
	_ = unix.UtimesNanoAt(unix.AT_FDCWD, abs, ts, unix.AT_SYMLINK_NOFOLLOW)
	return nil
}
