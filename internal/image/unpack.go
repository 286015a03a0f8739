package image

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/errdefs"
)

// What an unpacked layer keeps of an image's tar entries, and why:
//
//   - Every path stays inside the layer directory: names are joined under
//     the layer root (cleanName), parents are resolved by the kernel without
//     following symlinks (layerRoot), hardlinks link only files inside it.
//   - Whiteouts become overlayfs whiteouts (0/0 character devices) and opaque
//     markers the trusted.overlay.opaque xattr; a whiteout that names no
//     sibling (".wh.", ".wh..", ".wh...") is refused.
//   - Character and block devices are not created on the host: an image
//     cannot plant a device node the host's kernel would honour. The path is
//     simply absent from the layer; a sandbox sees the /dev its runtime
//     mounts, and no device elsewhere. FIFOs are kept.
//   - Extended attributes: only user.* and security.capability (file
//     capabilities, which e.g. ping needs; a sandbox's bounding set still
//     limits them) are applied. trusted.* (overlayfs' own: opaque, redirect,
//     metacopy, origin), other security.* (SELinux labels, IMA/EVM) and
//     system.* (ACLs) are dropped: they would be obeyed by the host kernel.
//   - Owners, modes (setuid/setgid included) and times are kept: they are
//     the image's content. The store keeps layers under 0700 directories,
//     so no host user but root can reach a setuid file in them.
//   - Duplicate entries replace what came before (a directory over a
//     directory merges), as docker and containerd do.

// layerLimits bound one layer's unpack.
type layerLimits struct {
	bytes   int64  // file data written
	what    string // which limit bytes is, for errors ("layer")
	entries int
	path    int
}

// unpacker writes one layer's tar stream into dir, converting OCI whiteouts
// to overlayfs ones.
type unpacker struct {
	root    *layerRoot
	lim     layerLimits
	written int64
	entries int
	times   []dirTime
	skipped map[string]bool // device nodes not created, for hardlinks to them
	buf     []byte
}

type dirTime struct {
	rel   string
	mtime time.Time
}

// unpackTar unpacks r into dir, which must exist and be empty. Errors are
// InvalidArgument for a malformed or hostile layer, ResourceExhausted for
// one over lim, or the class of r's own error; dir is left for the caller to
// remove.
func unpackTar(ctx context.Context, r io.Reader, dir string, lim layerLimits) error {
	root, err := openLayerRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	u := &unpacker{root: root, lim: lim, skipped: map[string]bool{}, buf: make([]byte, 256<<10)}
	tr := tar.NewReader(r)
	for {
		if err := ctx.Err(); err != nil {
			return readErr("unpack layer", err)
		}
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return readErr("read layer tar", err)
		}
		if u.entries++; u.entries > lim.entries {
			return exhausted("layer's number of entries", int64(lim.entries))
		}
		if err := u.entry(hdr, tr); err != nil {
			return fmt.Errorf("layer entry %q: %w", hdr.Name, err)
		}
	}
	// Directory mtimes last: creating children changed them. A directory
	// replaced since (by a file, or a symlink above it) fails to resolve and
	// is skipped.
	for i := len(u.times) - 1; i >= 0; i-- {
		t := u.times[i]
		if t.rel == "." {
			_ = unix.UtimesNanoAt(root.fd, ".", timespecs(t.mtime), 0)
			continue
		}
		pfd, base, err := root.parent(t.rel, false)
		if err != nil {
			continue
		}
		if st, ok, _ := lstatAt(pfd, base); ok && st.Mode&unix.S_IFMT == unix.S_IFDIR {
			_ = unix.UtimesNanoAt(pfd, base, timespecs(t.mtime), unix.AT_SYMLINK_NOFOLLOW)
		}
		unix.Close(pfd)
	}
	return nil
}

// readErr keeps the class of a read error (a limit, a network failure
// classified upstream), classifies a cancelled context or a network error,
// and calls anything else a malformed layer.
func readErr(what string, err error) error {
	var ne net.Error
	switch {
	case isClassified(err):
		return fmt.Errorf("%s: %w", what, err)
	case errors.Is(err, context.Canceled):
		return fmt.Errorf("%s: %v: %w", what, err, errdefs.ErrCanceled)
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("%s: %v: %w", what, err, errdefs.ErrDeadlineExceeded)
	case errors.As(err, &ne):
		return fmt.Errorf("%s: %v: %w", what, err, errdefs.ErrUnavailable)
	}
	return fmt.Errorf("%s: %v: %w", what, err, errdefs.ErrInvalidArgument)
}

func timespecs(t time.Time) []unix.Timespec {
	ts := unix.NsecToTimespec(t.UnixNano())
	return []unix.Timespec{ts, ts}
}

func (u *unpacker) entry(hdr *tar.Header, r io.Reader) error {
	rel, err := cleanName(hdr.Name, u.lim.path)
	if err != nil {
		return err
	}
	if hdr.Uid < 0 || hdr.Uid > 0xfffffffe || hdr.Gid < 0 || hdr.Gid > 0xfffffffe {
		return fmt.Errorf("owner %d:%d out of range: %w", hdr.Uid, hdr.Gid, errdefs.ErrInvalidArgument)
	}
	if inMeta(rel) {
		return nil // AUFS metadata (.wh..wh.plnk, ...): not needed
	}
	if rel == "." {
		// The layer root: only a directory entry means anything (its
		// attributes); anything else cannot replace the root.
		if hdr.Typeflag != tar.TypeDir {
			return nil
		}
		return u.attrs(hdr, u.root.fd, ".", rel)
	}
	kind, target, err := whiteout(path.Base(rel))
	if err != nil {
		return err
	}
	switch kind {
	case whMeta:
		return nil // AUFS metadata (inMeta skipped it already)
	case whOpaque:
		dir := path.Dir(rel)
		fd, err := u.root.openDir(dir, true)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		// Through "." of the O_PATH fd, for an fd fsetxattr accepts.
		dfd, err := unix.Openat(fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open %s: %v: %w", dir, err, errdefs.ErrInternal)
		}
		defer unix.Close(dfd)
		if err := unix.Fsetxattr(dfd, "trusted.overlay.opaque", []byte("y"), 0); err != nil {
			return fmt.Errorf("set opaque xattr: %v: %w", err, errdefs.ErrInternal)
		}
		return nil
	case whFile:
		pfd, _, err := u.root.parent(rel, true)
		if err != nil {
			return err
		}
		defer unix.Close(pfd)
		if err := u.replace(pfd, path.Join(path.Dir(rel), target), target, false); err != nil {
			return err
		}
		if err := unix.Mknodat(pfd, target, unix.S_IFCHR, 0); err != nil {
			return fmt.Errorf("mknod whiteout: %v: %w", err, errdefs.ErrInternal)
		}
		return nil
	}

	pfd, base, err := u.root.parent(rel, true)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	delete(u.skipped, rel)
	switch hdr.Typeflag {
	case tar.TypeDir:
		if err := u.replace(pfd, rel, base, true); err != nil {
			return err
		}
		if err := unix.Mkdirat(pfd, base, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("mkdir: %v: %w", err, errdefs.ErrInternal)
		}
	case tar.TypeReg, tar.TypeRegA, tar.TypeGNUSparse:
		// archive/tar expands a sparse file's holes: it is written whole,
		// and its logical size counts against the limit.
		if err := u.replace(pfd, rel, base, false); err != nil {
			return err
		}
		return u.file(hdr, r, pfd, base, rel)
	case tar.TypeSymlink:
		if hdr.Linkname == "" || len(hdr.Linkname) > u.lim.path || strings.IndexByte(hdr.Linkname, 0) >= 0 {
			return fmt.Errorf("symlink target empty, over %d bytes or with a NUL: %w", u.lim.path, errdefs.ErrInvalidArgument)
		}
		if err := u.replace(pfd, rel, base, false); err != nil {
			return err
		}
		if err := unix.Symlinkat(hdr.Linkname, pfd, base); err != nil {
			return fmt.Errorf("symlink: %v: %w", err, errdefs.ErrInternal)
		}
	case tar.TypeLink:
		return u.hardlink(hdr, pfd, base, rel)
	case tar.TypeChar, tar.TypeBlock:
		// Not created on the host (see above); what was there goes.
		if err := u.replace(pfd, rel, base, false); err != nil {
			return err
		}
		u.skipped[rel] = true
		return nil
	case tar.TypeFifo:
		if err := u.replace(pfd, rel, base, false); err != nil {
			return err
		}
		if err := unix.Mknodat(pfd, base, unix.S_IFIFO|0o600, 0); err != nil {
			return fmt.Errorf("mkfifo: %v: %w", err, errdefs.ErrInternal)
		}
	default:
		return nil // global headers, unknown types: skipped, like containerd does
	}
	return u.attrs(hdr, pfd, base, rel)
}

// file creates a regular file from the entry's data, within the byte budget.
func (u *unpacker) file(hdr *tar.Header, r io.Reader, pfd int, base, rel string) error {
	if hdr.Size < 0 || hdr.Size > u.lim.bytes-u.written {
		what := u.lim.what
		if what == "" {
			what = "layer"
		}
		return exhausted("file data of the "+what, u.lim.bytes)
	}
	fd, err := unix.Openat(pfd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("create: %v: %w", err, errdefs.ErrInternal)
	}
	f := os.NewFile(uintptr(fd), rel)
	n, err := io.CopyBuffer(onlyWriter{f}, io.LimitReader(r, hdr.Size), u.buf)
	u.written += n
	if cerr := f.Close(); err == nil && cerr != nil {
		return fmt.Errorf("write: %v: %w", cerr, errdefs.ErrInternal)
	}
	if err != nil {
		return readErr("write", err)
	}
	if n != hdr.Size {
		return fmt.Errorf("write: %v: %w", io.ErrUnexpectedEOF, errdefs.ErrInvalidArgument)
	}
	return u.attrs(hdr, pfd, base, rel)
}

// onlyWriter hides *os.File's ReadFrom, so io.CopyBuffer uses our buffer.
type onlyWriter struct{ io.Writer }

// hardlink links rel to an existing non-directory of the layer.
func (u *unpacker) hardlink(hdr *tar.Header, pfd int, base, rel string) error {
	lrel, err := cleanName(hdr.Linkname, u.lim.path)
	if err != nil {
		return fmt.Errorf("hardlink target: %w", err)
	}
	if u.skipped[lrel] {
		if err := u.replace(pfd, rel, base, false); err != nil {
			return err
		}
		u.skipped[rel] = true // a link to a device that was not created
		return nil
	}
	if lrel == "." {
		return fmt.Errorf("hardlink to the layer root: %w", errdefs.ErrInvalidArgument)
	}
	spfd, sbase, err := u.root.parent(lrel, false)
	if err != nil {
		return fmt.Errorf("hardlink target %q: %w", hdr.Linkname, err)
	}
	defer unix.Close(spfd)
	st, ok, err := lstatAt(spfd, sbase)
	if err != nil {
		return err
	}
	if !ok || st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return fmt.Errorf("hardlink target %q missing or a directory: %w", hdr.Linkname, errdefs.ErrInvalidArgument)
	}
	if lrel == rel {
		return nil // a link to itself: already there
	}
	if err := u.replace(pfd, rel, base, false); err != nil {
		return err
	}
	// linkat without AT_SYMLINK_FOLLOW links a symlink itself, never what
	// it points to.
	if err := unix.Linkat(spfd, sbase, pfd, base, 0); err != nil {
		return fmt.Errorf("hardlink: %v: %w", err, errdefs.ErrInternal)
	}
	return nil // shares the target's inode and attributes
}

// replace removes whatever is at base in pfd (rel from the root) unless both
// it and the new entry are directories (a directory entry over an existing
// one just updates it).
func (u *unpacker) replace(pfd int, rel, base string, newIsDir bool) error {
	st, ok, err := lstatAt(pfd, base)
	if err != nil || !ok {
		return err
	}
	isDir := st.Mode&unix.S_IFMT == unix.S_IFDIR
	if isDir && newIsDir {
		return nil
	}
	if !isDir {
		if err := unix.Unlinkat(pfd, base, 0); err != nil {
			return fmt.Errorf("replace: %v: %w", err, errdefs.ErrInternal)
		}
		return nil
	}
	return u.root.removeAll(rel)
}

// keepXattr says which image-supplied extended attributes are applied (see
// the top of this file).
func keepXattr(name string) bool {
	return strings.HasPrefix(name, "user.") || name == "security.capability"
}

// attrs applies ownership, xattrs, mode and times from hdr to base in pfd,
// which was just created by this entry (so it is what its type says).
func (u *unpacker) attrs(hdr *tar.Header, pfd int, base, rel string) error {
	if err := unix.Fchownat(pfd, base, hdr.Uid, hdr.Gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("chown: %v: %w", err, errdefs.ErrInternal)
	}
	if hdr.Typeflag == tar.TypeSymlink {
		_ = unix.UtimesNanoAt(pfd, base, timespecs(hdr.ModTime), unix.AT_SYMLINK_NOFOLLOW)
		return nil
	}
	// After chown, which clears set-id bits and file capabilities.
	switch hdr.Typeflag {
	case tar.TypeDir, tar.TypeReg, tar.TypeRegA, tar.TypeGNUSparse:
		if err := u.xattrs(hdr, pfd, base); err != nil {
			return err
		}
	}
	if err := unix.Fchmodat(pfd, base, uint32(hdr.Mode&0o7777), 0); err != nil {
		return fmt.Errorf("chmod: %v: %w", err, errdefs.ErrInternal)
	}
	if hdr.Typeflag == tar.TypeDir {
		u.times = append(u.times, dirTime{rel, hdr.ModTime})
		return nil
	}
	_ = unix.UtimesNanoAt(pfd, base, timespecs(hdr.ModTime), unix.AT_SYMLINK_NOFOLLOW)
	return nil
}

func (u *unpacker) xattrs(hdr *tar.Header, pfd int, base string) error {
	var fd = -1
	for k, v := range hdr.PAXRecords {
		x, ok := strings.CutPrefix(k, "SCHILY.xattr.")
		if !ok || !keepXattr(x) {
			continue
		}
		if fd < 0 {
			var err error
			fd, err = unix.Openat(pfd, base, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
			if err != nil {
				return fmt.Errorf("open for xattrs: %v: %w", err, errdefs.ErrInternal)
			}
			defer unix.Close(fd)
		}
		// Best effort: the filesystem may not support every namespace.
		_ = unix.Fsetxattr(fd, x, []byte(v), 0)
	}
	return nil
}
