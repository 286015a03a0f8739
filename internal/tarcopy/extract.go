// Package tarcopy moves files and directories as tar streams, for `forkbox
// cp`: Write makes a stream of one file or tree, Extract unpacks one into a
// directory. Extract takes streams from outside (an API caller, on the
// agent's side; a sandbox, on the CLI's side), so it keeps every entry
// below its directory: names with ".." or absolute names are refused, every
// parent is opened without following symlinks (a symlink in the stream, or
// one a process swaps in meanwhile, is never written through), an existing
// file is unlinked before it is replaced, and the stream is bounded.
package tarcopy

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/errdefs"
)

// Bounds of one stream besides its size.
const (
	maxEntries = 1 << 20
	maxDepth   = 256
	maxName    = 4096
)

// ExtractOptions bound and shape an extraction.
type ExtractOptions struct {
	// MaxBytes bounds the stream (headers and content); past it the
	// extraction stops with ResourceExhausted. Required (> 0).
	MaxBytes int64
	// KeepSpecialBits keeps setuid, setgid and sticky bits (inside a
	// sandbox); without it they are dropped (on the host).
	KeepSpecialBits bool
	// TopName, when set, replaces the first element of every entry's name
	// (`cp sb:/dir ./other` extracts dir's stream as other).
	TopName string
}

// Result says what an extraction or a write moved.
type Result struct {
	Bytes   int64 `json:"bytes"`
	Entries int64 `json:"entries"`
}

// countingReader counts what it reads and fails past max.
type countingReader struct {
	r   io.Reader
	n   int64
	max int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	if c.n > c.max {
		return n, fmt.Errorf("tar stream larger than %d bytes: %w", c.max, errdefs.ErrResourceExhausted)
	}
	return n, err
}

type dirFix struct {
	parts []string
	mode  uint32
	mtime time.Time
}

// Extract unpacks the tar stream r into dir (made if missing). Regular
// files, directories, symlinks and hard links are kept, with their mode and
// mtime; owners are not (entries belong to the extracting user). Device
// nodes, FIFOs and sockets are an InvalidArgument. On error what was
// extracted so far stays, all of it below dir. It reads r to the end of
// the archive, not further.
func Extract(ctx context.Context, r io.Reader, dir string, o ExtractOptions) (Result, error) {
	if o.MaxBytes <= 0 {
		return Result{}, fmt.Errorf("extract: no size bound: %w", errdefs.ErrInvalidArgument)
	}
	if top, err := entryParts(o.TopName); o.TopName != "" && (err != nil || len(top) != 1) {
		return Result{}, fmt.Errorf("extract: name %q: want one path element: %w", o.TopName, errdefs.ErrInvalidArgument)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return Result{}, osErr("mkdir", dir, err)
	}
	root, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return Result{}, osErr("open", dir, err)
	}
	defer unix.Close(root)
	cr := &countingReader{r: r, max: o.MaxBytes}
	tr := tar.NewReader(cr)
	var res Result
	var dirs []dirFix
	for {
		if err := ctx.Err(); err != nil {
			return res, fmt.Errorf("extract: %w: %w", errdefs.ErrCanceled, err)
		}
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			if errdefs.Class(err) != errdefs.ErrUnknown {
				return res, err
			}
			return res, fmt.Errorf("extract: bad tar stream: %v: %w", err, errdefs.ErrInvalidArgument)
		}
		res.Entries++
		if res.Entries > maxEntries {
			return res, fmt.Errorf("extract: more than %d entries: %w", maxEntries, errdefs.ErrResourceExhausted)
		}
		parts, err := entryParts(h.Name)
		if err != nil {
			return res, err
		}
		if o.TopName != "" && len(parts) > 0 {
			parts[0] = o.TopName
		}
		if len(parts) == 0 {
			// "./": the directory itself.
			if h.Typeflag == tar.TypeDir {
				dirs = append(dirs, dirFix{parts: nil, mode: perm(h, o), mtime: h.ModTime})
				continue
			}
			return res, fmt.Errorf("extract: entry %q names the target directory: %w", h.Name, errdefs.ErrInvalidArgument)
		}
		if err := extractEntry(root, parts, h, tr, o, &dirs); err != nil {
			return res, err
		}
	}
	// Directory modes last (a read-only directory would refuse its own
	// entries), deepest first.
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := fixDir(root, dirs[i]); err != nil {
			return res, err
		}
	}
	res.Bytes = cr.n
	return res, nil
}

// entryParts validates an entry name and splits it into components.
func entryParts(name string) ([]string, error) {
	switch {
	case len(name) > maxName:
		return nil, fmt.Errorf("extract: entry name of %d bytes: %w", len(name), errdefs.ErrInvalidArgument)
	case strings.ContainsRune(name, 0):
		return nil, fmt.Errorf("extract: entry %q contains NUL: %w", name, errdefs.ErrInvalidArgument)
	case strings.HasPrefix(name, "/"):
		return nil, fmt.Errorf("extract: entry %q is absolute: %w", name, errdefs.ErrInvalidArgument)
	}
	var parts []string
	for _, p := range strings.Split(name, "/") {
		switch p {
		case "", ".":
		case "..":
			return nil, fmt.Errorf("extract: entry %q contains \"..\": %w", name, errdefs.ErrInvalidArgument)
		default:
			parts = append(parts, p)
		}
	}
	if len(parts) > maxDepth {
		return nil, fmt.Errorf("extract: entry %q is deeper than %d: %w", name, maxDepth, errdefs.ErrInvalidArgument)
	}
	return parts, nil
}

func perm(h *tar.Header, o ExtractOptions) uint32 {
	m := uint32(h.Mode) & 0o7777
	if !o.KeepSpecialBits {
		m &= 0o777
	}
	return m
}

// openParent opens the directory that holds parts' last element, walking
// from root without following a symlink; missing directories are made
// (0755) when mkdir is set.
func openParent(root int, parts []string, mkdir bool) (int, error) {
	fd, err := unix.Dup(root)
	if err != nil {
		return -1, osErr("dup", ".", err)
	}
	for i, p := range parts[:len(parts)-1] {
		next, err := openDirNoFollow(fd, p)
		if errors.Is(err, unix.ENOENT) && mkdir {
			if err = unix.Mkdirat(fd, p, 0o755); err == nil || errors.Is(err, unix.EEXIST) {
				next, err = openDirNoFollow(fd, p)
			}
		}
		unix.Close(fd)
		if err != nil {
			where := path.Join(parts[:i+1]...)
			if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
				return -1, fmt.Errorf("extract: %s is a symlink or not a directory; entries are never written through one: %w", where, errdefs.ErrInvalidArgument)
			}
			return -1, osErr("open", where, err)
		}
		fd = next
	}
	return fd, nil
}

// openDirNoFollow opens the directory name in dir, refusing a symlink. It
// does not rely on O_NOFOLLOW alone (gVisor's openat follows a symlink
// with O_NOFOLLOW|O_DIRECTORY): name is lstat'ed first, and what was opened
// must be the same inode, so a symlink swapped in meanwhile is refused too.
func openDirNoFollow(dir int, name string) (int, error) {
	var before unix.Stat_t
	if err := unix.Fstatat(dir, name, &before, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return -1, err
	}
	if before.Mode&unix.S_IFMT != unix.S_IFDIR {
		return -1, unix.ENOTDIR
	}
	fd, err := unix.Openat(dir, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	var after unix.Stat_t
	if err := unix.Fstat(fd, &after); err != nil || after.Dev != before.Dev || after.Ino != before.Ino {
		unix.Close(fd)
		return -1, unix.ELOOP
	}
	return fd, nil
}

// clearPath removes what is at name in dir unless it is a directory; it
// reports whether a directory is there.
func clearPath(dir int, name string) (isDir bool, err error) {
	var st unix.Stat_t
	if err := unix.Fstatat(dir, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return false, nil
		}
		return false, osErr("stat", name, err)
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return true, nil
	}
	if err := unix.Unlinkat(dir, name, 0); err != nil && !errors.Is(err, unix.ENOENT) {
		return false, osErr("unlink", name, err)
	}
	return false, nil
}

func extractEntry(root int, parts []string, h *tar.Header, r io.Reader, o ExtractOptions, dirs *[]dirFix) error {
	name := path.Join(parts...)
	parent, err := openParent(root, parts, true)
	if err != nil {
		return err
	}
	defer unix.Close(parent)
	base := parts[len(parts)-1]
	switch h.Typeflag {
	case tar.TypeDir:
		isDir, err := clearPath(parent, base)
		if err != nil {
			return err
		}
		if !isDir {
			if err := unix.Mkdirat(parent, base, 0o700); err != nil {
				return osErr("mkdir", name, err)
			}
		}
		*dirs = append(*dirs, dirFix{parts: parts, mode: perm(h, o), mtime: h.ModTime})
		return nil
	case tar.TypeReg, tar.TypeRegA:
		if isDir, err := clearPath(parent, base); err != nil {
			return err
		} else if isDir {
			return fmt.Errorf("extract: %s: a directory is there, not replaced by a file: %w", name, errdefs.ErrInvalidArgument)
		}
		fd, err := unix.Openat(parent, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return osErr("create", name, err)
		}
		f := os.NewFile(uintptr(fd), name)
		defer f.Close()
		if _, err := io.Copy(f, r); err != nil {
			if errdefs.Class(err) != errdefs.ErrUnknown {
				return err
			}
			var pe *os.PathError
			if errors.As(err, &pe) {
				return osErr("write", name, err)
			}
			return fmt.Errorf("extract: %s: bad tar stream: %v: %w", name, err, errdefs.ErrInvalidArgument)
		}
		if err := unix.Fchmod(fd, perm(h, o)); err != nil {
			return osErr("chmod", name, err)
		}
		if err := unix.Futimes(fd, times(h.ModTime)); err != nil {
			return osErr("utimes", name, err)
		}
		return f.Close()
	case tar.TypeSymlink:
		if isDir, err := clearPath(parent, base); err != nil {
			return err
		} else if isDir {
			return fmt.Errorf("extract: %s: a directory is there, not replaced by a symlink: %w", name, errdefs.ErrInvalidArgument)
		}
		if len(h.Linkname) > maxName || strings.ContainsRune(h.Linkname, 0) {
			return fmt.Errorf("extract: %s: bad symlink target: %w", name, errdefs.ErrInvalidArgument)
		}
		if err := unix.Symlinkat(h.Linkname, parent, base); err != nil {
			return osErr("symlink", name, err)
		}
		ts := []unix.Timespec{unix.NsecToTimespec(h.ModTime.UnixNano()), unix.NsecToTimespec(h.ModTime.UnixNano())}
		_ = unix.UtimesNanoAt(parent, base, ts, unix.AT_SYMLINK_NOFOLLOW) // not every filesystem has symlink times
		return nil
	case tar.TypeLink:
		target, err := entryParts(h.Linkname)
		if err != nil || len(target) == 0 {
			return fmt.Errorf("extract: %s: hard link to %q outside the stream: %w", name, h.Linkname, errdefs.ErrInvalidArgument)
		}
		tparent, err := openParent(root, target, false)
		if err != nil {
			return err
		}
		defer unix.Close(tparent)
		if isDir, err := clearPath(parent, base); err != nil {
			return err
		} else if isDir {
			return fmt.Errorf("extract: %s: a directory is there, not replaced by a link: %w", name, errdefs.ErrInvalidArgument)
		}
		// Flags 0: a symlink target is linked itself, never followed.
		if err := unix.Linkat(tparent, target[len(target)-1], parent, base, 0); err != nil {
			return osErr("link", name, err)
		}
		return nil
	case tar.TypeXGlobalHeader:
		return nil
	}
	return fmt.Errorf("extract: %s: entry type %q (devices, FIFOs and sockets are not copied): %w", name, h.Typeflag, errdefs.ErrInvalidArgument)
}

func fixDir(root int, d dirFix) error {
	fd := -1
	var err error
	if len(d.parts) == 0 {
		fd, err = unix.Dup(root)
	} else {
		var parent int
		if parent, err = openParent(root, d.parts, false); err != nil {
			return err
		}
		fd, err = openDirNoFollow(parent, d.parts[len(d.parts)-1])
		unix.Close(parent)
	}
	name := path.Join(d.parts...)
	if err != nil {
		return osErr("open", name, err)
	}
	defer unix.Close(fd)
	if err := unix.Fchmod(fd, d.mode); err != nil {
		return osErr("chmod", name, err)
	}
	if err := unix.Futimes(fd, times(d.mtime)); err != nil {
		return osErr("utimes", name, err)
	}
	return nil
}

func times(t time.Time) []unix.Timeval {
	tv := unix.NsecToTimeval(t.UnixNano())
	return []unix.Timeval{tv, tv}
}

// osErr gives an error from a system call its class.
func osErr(op, name string, err error) error {
	var class error
	switch {
	case errors.Is(err, unix.ENOENT), errors.Is(err, unix.ENOTDIR):
		class = errdefs.ErrNotFound
	case errors.Is(err, unix.EACCES), errors.Is(err, unix.EPERM), errors.Is(err, unix.EROFS):
		class = errdefs.ErrPermissionDenied
	case errors.Is(err, unix.EEXIST):
		class = errdefs.ErrAlreadyExists
	case errors.Is(err, unix.ENOSPC), errors.Is(err, unix.EDQUOT), errors.Is(err, unix.EFBIG):
		class = errdefs.ErrResourceExhausted
	case errors.Is(err, unix.ELOOP), errors.Is(err, unix.EISDIR), errors.Is(err, unix.ENAMETOOLONG):
		class = errdefs.ErrInvalidArgument
	default:
		class = errdefs.ErrInternal
	}
	var pe *os.PathError
	if errors.As(err, &pe) {
		err = pe.Err
	}
	return fmt.Errorf("%s %s: %v: %w", op, name, err, class)
}
