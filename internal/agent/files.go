package agent

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/errdefs"
)

// checkPath validates a path from the wire: absolute, no NUL, no ".."
// element (checked before cleaning). It returns the cleaned path.
func checkPath(p string) (string, error) {
	switch {
	case p == "":
		return "", fmt.Errorf("path is empty: %w", errdefs.ErrInvalidArgument)
	case strings.ContainsRune(p, 0):
		return "", fmt.Errorf("path %q contains NUL: %w", p, errdefs.ErrInvalidArgument)
	case !strings.HasPrefix(p, "/"):
		return "", fmt.Errorf("path %q is not absolute: %w", p, errdefs.ErrInvalidArgument)
	}
	for _, el := range strings.Split(p, "/") {
		if el == ".." {
			return "", fmt.Errorf("path %q contains \"..\": %w", p, errdefs.ErrInvalidArgument)
		}
	}
	return filepath.Clean(p), nil
}

// handleRead streams a file's content as data frames, then a result. Only
// regular files are read: the file is opened without blocking, so a FIFO
// (or a device) is refused instead of hanging the request.
func (s *Server) handleRead(fw *frameWriter, hdr *request) error {
	p, err := checkPath(hdr.Path)
	if err != nil {
		return err
	}
	f, err := openRegular(p)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return osErr("stat", p, err)
	}
	if fi.Size() > MaxFileSize {
		return fmt.Errorf("read %s: %d bytes, limit %d: %w", p, fi.Size(), MaxFileSize, errdefs.ErrResourceExhausted)
	}
	buf := make([]byte, chunkSize)
	var total int64
	for {
		n, err := f.Read(buf)
		if n > 0 {
			total += int64(n)
			if total > MaxFileSize {
				return fmt.Errorf("read %s: grew past limit %d: %w", p, MaxFileSize, errdefs.ErrResourceExhausted)
			}
			if err := fw.write(frameData, streamStdin, buf[:n]); err != nil {
				return err
			}
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return osErr("read", p, err)
		}
	}
	return fw.writeJSON(frameResult, struct {
		Size int64 `json:"size"`
	}{total})
}

// openRegular opens the regular file p for reading. It opens with
// O_NONBLOCK, so that opening a FIFO without a writer does not block,
// refuses anything but a regular file, then clears O_NONBLOCK.
func openRegular(p string) (*os.File, error) {
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, osErr("read", p, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, osErr("stat", p, err)
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
	case unix.S_IFDIR:
		unix.Close(fd)
		return nil, fmt.Errorf("read %s: is a directory: %w", p, errdefs.ErrInvalidArgument)
	default:
		unix.Close(fd)
		return nil, fmt.Errorf("read %s: not a regular file: %w", p, errdefs.ErrInvalidArgument)
	}
	if err := unix.SetNonblock(fd, false); err != nil {
		unix.Close(fd)
		return nil, osErr("read", p, err)
	}
	return os.NewFile(uintptr(fd), p), nil
}

// handleWrite receives a file's content as data frames closed by an EOF
// frame and puts it in place atomically (temp file + rename). On error the
// caller drains the unread rest of the body.
func (s *Server) handleWrite(body *reqBody, fw *frameWriter, hdr *request) error {
	p, err := checkPath(hdr.Path)
	if err != nil {
		return err
	}
	if hdr.Size > MaxFileSize {
		return fmt.Errorf("write %s: %d bytes, limit %d: %w", p, hdr.Size, MaxFileSize, errdefs.ErrResourceExhausted)
	}
	if p == "/" {
		return fmt.Errorf("write /: is a directory: %w", errdefs.ErrInvalidArgument)
	}
	mode := os.FileMode(hdr.Mode).Perm()
	if hdr.Mode == 0 {
		mode = 0o644
	}
	dir := filepath.Dir(p)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return osErr("mkdir", dir, err)
	}
	if fi, err := os.Stat(p); err == nil && fi.IsDir() {
		return fmt.Errorf("write %s: is a directory: %w", p, errdefs.ErrInvalidArgument)
	}
	tmp, err := os.CreateTemp(dir, ".forkbox-write-*")
	if err != nil {
		return osErr("create", dir, err)
	}
	ok := false
	defer func() {
		if !ok {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	var total int64
	for {
		f, err := body.next()
		if err != nil {
			return fmt.Errorf("write %s: read content: %v: %w", p, err, errdefs.ErrUnavailable)
		}
		if f.typ == frameEOF {
			break
		}
		if f.typ != frameData {
			return fmt.Errorf("write %s: unexpected frame %q: %w", p, f.typ, errdefs.ErrInvalidArgument)
		}
		total += int64(len(f.payload))
		if total > MaxFileSize {
			return fmt.Errorf("write %s: more than %d bytes: %w", p, MaxFileSize, errdefs.ErrResourceExhausted)
		}
		if _, err := tmp.Write(f.payload); err != nil {
			return osErr("write", p, err)
		}
	}
	if err := tmp.Chmod(mode); err != nil {
		return osErr("chmod", p, err)
	}
	if err := tmp.Close(); err != nil {
		return osErr("write", p, err)
	}
	if err := os.Rename(tmp.Name(), p); err != nil {
		return osErr("rename", p, err)
	}
	ok = true
	return fw.writeJSON(frameResult, struct{}{})
}
