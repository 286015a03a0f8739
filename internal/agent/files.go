package agent

import (
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

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

// handleRead streams a file's content as data frames, then a result.
func (s *Server) handleRead(fw *frameWriter, hdr *request) error {
	p, err := checkPath(hdr.Path)
	if err != nil {
		return err
	}
	f, err := os.Open(p)
	if err != nil {
		return osErr("read", p, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return osErr("stat", p, err)
	}
	if fi.IsDir() {
		return fmt.Errorf("read %s: is a directory: %w", p, errdefs.ErrInvalidArgument)
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

// handleWrite receives a file's content as data frames closed by an EOF
// frame and puts it in place atomically (temp file + rename).
func (s *Server) handleWrite(conn net.Conn, fw *frameWriter, hdr *request) error {
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
	ok, drained := false, false
	defer func() {
		if !ok {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	defer func() {
		if !drained {
			drainUntilEOF(conn)
		}
	}()
	var total int64
	for {
		f, err := readFrame(conn)
		if err != nil {
			drained = true
			return fmt.Errorf("write %s: read content: %v: %w", p, err, errdefs.ErrUnavailable)
		}
		if f.typ == frameEOF {
			drained = true
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

// drainUntilEOF discards the rest of a request the agent refused, so that
// closing the connection does not reset it before the client read the error.
func drainUntilEOF(conn net.Conn) {
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	defer conn.SetReadDeadline(time.Time{})
	for {
		f, err := readFrame(conn)
		if err != nil || f.typ == frameEOF {
			return
		}
	}
}

// handleList answers with the entries of a directory (not following
// symlinks of the entries).
func (s *Server) handleList(fw *frameWriter, hdr *request) error {
	p, err := checkPath(hdr.Path)
	if err != nil {
		return err
	}
	fi, err := os.Stat(p)
	if err != nil {
		return osErr("list", p, err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("list %s: not a directory: %w", p, errdefs.ErrInvalidArgument)
	}
	ents, err := os.ReadDir(p)
	if err != nil {
		return osErr("list", p, err)
	}
	res := listResult{Entries: make([]FileInfo, 0, len(ents))}
	for _, e := range ents {
		info, err := e.Info()
		if err != nil {
			continue // removed meanwhile
		}
		res.Entries = append(res.Entries, FileInfo{
			Name: e.Name(), Size: info.Size(), Mode: info.Mode(),
			IsDir: info.IsDir(), ModTime: info.ModTime(),
		})
	}
	return fw.writeJSON(frameResult, res)
}
