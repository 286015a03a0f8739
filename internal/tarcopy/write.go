package tarcopy

import (
	"archive/tar"
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/errdefs"
)

// countingWriter counts what it writes and fails past max.
type countingWriter struct {
	w   io.Writer
	n   int64
	max int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	if c.n+int64(len(p)) > c.max {
		return 0, fmt.Errorf("tar stream larger than %d bytes: %w", c.max, errdefs.ErrResourceExhausted)
	}
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// Write writes src (a file, a symlink, or a directory and everything
// below it) to w as a tar stream whose one top-level entry is named name
// (default: src's base name). Symlinks are written as symlinks, never
// followed (src itself included); sockets, FIFOs and devices are left
// out. The stream is bounded by maxBytes (ResourceExhausted past it).
func Write(ctx context.Context, w io.Writer, src, name string, maxBytes int64) (Result, error) {
	if maxBytes <= 0 {
		return Result{}, fmt.Errorf("write: no size bound: %w", errdefs.ErrInvalidArgument)
	}
	if name == "" {
		name = filepath.Base(src)
	}
	if parts, err := entryParts(name); err != nil || len(parts) != 1 {
		return Result{}, fmt.Errorf("tar entry name %q: want one path element: %w", name, errdefs.ErrInvalidArgument)
	}
	if _, err := os.Lstat(src); err != nil {
		return Result{}, osErr("stat", src, err)
	}
	cw := &countingWriter{w: w, max: maxBytes}
	tw := tar.NewWriter(cw)
	var res Result
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return osErr("walk", p, err)
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("write: %w: %w", errdefs.ErrCanceled, err)
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return fmt.Errorf("write: %s: %v: %w", p, err, errdefs.ErrInternal)
		}
		entry := path.Join(name, filepath.ToSlash(rel))
		fi, err := d.Info()
		if err != nil {
			return osErr("stat", p, err)
		}
		link := ""
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			if link, err = os.Readlink(p); err != nil {
				return osErr("readlink", p, err)
			}
		case fi.IsDir(), fi.Mode().IsRegular():
		default:
			return nil // sockets, FIFOs, devices
		}
		h, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return fmt.Errorf("write: %s: %v: %w", p, err, errdefs.ErrInternal)
		}
		h.Name = entry
		if fi.IsDir() {
			h.Name += "/"
		}
		h.Uname, h.Gname = "", ""
		if err := tw.WriteHeader(h); err != nil {
			return writeErr(p, err)
		}
		res.Entries++
		if fi.Mode().IsRegular() {
			return copyFile(tw, p, h.Size, fi)
		}
		return nil
	})
	if err != nil {
		return res, err
	}
	if err := tw.Close(); err != nil {
		return res, writeErr(src, err)
	}
	res.Bytes = cw.n
	return res, nil
}

// copyFile copies exactly size bytes of the regular file p (opened without
// following a symlink or blocking on a FIFO swapped in meanwhile).
func copyFile(w io.Writer, p string, size int64, walked fs.FileInfo) error {
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return osErr("open", p, err)
	}
	f := os.NewFile(uintptr(fd), p)
	defer f.Close()
	var st unix.Stat_t
	ws, _ := walked.Sys().(*syscall.Stat_t)
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG || ws == nil || st.Ino != ws.Ino || st.Dev != ws.Dev {
		return fmt.Errorf("write: %s changed while it was copied: %w", p, errdefs.ErrFailedPrecondition)
	}
	n, err := io.Copy(w, io.LimitReader(f, size))
	if err != nil {
		return writeErr(p, err)
	}
	if n < size {
		return fmt.Errorf("write: %s shrank while it was copied: %w", p, errdefs.ErrFailedPrecondition)
	}
	return nil
}

func writeErr(p string, err error) error {
	if errdefs.Class(err) != errdefs.ErrUnknown {
		return err
	}
	return fmt.Errorf("write %s: %v: %w", p, err, errdefs.ErrUnavailable)
}
