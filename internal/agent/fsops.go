package agent

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/forkbox/forkbox/errdefs"
)

// Bounds of the file operations.
const (
	// MaxWalkEntries bounds the entries one Walk returns.
	MaxWalkEntries = 10000
	// MaxListEntries bounds the entries one ListFiles returns: a larger
	// directory is ResourceExhausted (Walk pages through it), and an agent
	// that streams entries without end is cut off there.
	MaxListEntries = 100_000
	// MaxWalkDepth bounds a Walk's depth.
	MaxWalkDepth = 32
)

// Entry is one file as Stat, Walk and Watch describe it: symlinks are not
// followed (Symlink is the link's target).
type Entry struct {
	// Path is absolute (Stat, Walk) or relative to the watched directory
	// (Watch events).
	Path    string      `json:"path"`
	Name    string      `json:"name"`
	Size    int64       `json:"size"`
	Mode    os.FileMode `json:"mode"`
	ModTime time.Time   `json:"mtime"`
	Owner   string      `json:"owner,omitempty"`
	Group   string      `json:"group,omitempty"`
	Symlink string      `json:"symlink,omitempty"`
}

func entryOf(p string, fi fs.FileInfo) Entry {
	e := Entry{Path: p, Name: fi.Name(), Size: fi.Size(), Mode: fi.Mode(), ModTime: fi.ModTime()}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		e.Owner, e.Group = userName(st.Uid), groupName(st.Gid)
	}
	if fi.Mode()&fs.ModeSymlink != 0 {
		e.Symlink, _ = os.Readlink(p)
	}
	return e
}

func userName(uid uint32) string {
	id := strconv.FormatUint(uint64(uid), 10)
	if u, err := user.LookupId(id); err == nil {
		return u.Username
	}
	return id
}

func groupName(gid uint32) string {
	id := strconv.FormatUint(uint64(gid), 10)
	if g, err := user.LookupGroupId(id); err == nil {
		return g.Name
	}
	return id
}

// handleFileOp answers stat, mkdir, move, remove and walk. Paths are
// checked as every other op's (absolute, no ".."); symlinks are not
// followed by stat, remove or walk.
func (s *Server) handleFileOp(fw *frameWriter, hdr *request) error {
	p, err := checkPath(hdr.Path)
	if err != nil {
		return err
	}
	switch hdr.Op {
	case opStat:
		fi, err := os.Lstat(p)
		if err != nil {
			return osErr("stat", p, err)
		}
		return fw.writeJSON(frameResult, entryOf(p, fi))
	case opMkdir:
		if fi, err := os.Lstat(p); err == nil {
			if fi.IsDir() {
				return fmt.Errorf("mkdir %s: directory exists: %w", p, errdefs.ErrAlreadyExists)
			}
			return fmt.Errorf("mkdir %s: a file of that name exists: %w", p, errdefs.ErrInvalidArgument)
		}
		if err := os.MkdirAll(p, 0o755); err != nil {
			return osErr("mkdir", p, err)
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return osErr("stat", p, err)
		}
		return fw.writeJSON(frameResult, entryOf(p, fi))
	case opMove:
		dst, err := checkPath(hdr.Dest)
		if err != nil {
			return err
		}
		if p == "/" || dst == "/" {
			return fmt.Errorf("move %s to %s: cannot move /: %w", p, dst, errdefs.ErrInvalidArgument)
		}
		if _, err := os.Lstat(p); err != nil {
			return osErr("move", p, err)
		}
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return osErr("mkdir", filepath.Dir(dst), err)
		}
		if err := os.Rename(p, dst); err != nil {
			return osErr("move", p, err)
		}
		fi, err := os.Lstat(dst)
		if err != nil {
			return osErr("stat", dst, err)
		}
		return fw.writeJSON(frameResult, entryOf(dst, fi))
	case opRemove:
		if p == "/" {
			return fmt.Errorf("remove /: refused: %w", errdefs.ErrInvalidArgument)
		}
		if _, err := os.Lstat(p); err != nil {
			return osErr("remove", p, err)
		}
		if err := os.RemoveAll(p); err != nil {
			return osErr("remove", p, err)
		}
		return fw.writeJSON(frameResult, struct{}{})
	case opWalk:
		ents, err := walk(p, hdr.Depth)
		if err != nil {
			return err
		}
		return writeEntries(fw, ents)
	}
	return fmt.Errorf("unknown file op %q: %w", hdr.Op, errdefs.ErrNotImplemented)
}

// walk lists the directory p to depth levels (1: its entries only), in
// lexical order, at most MaxWalkEntries entries.
func walk(p string, depth int) ([]Entry, error) {
	if depth < 1 || depth > MaxWalkDepth {
		return nil, fmt.Errorf("walk %s: depth %d is not between 1 and %d: %w", p, depth, MaxWalkDepth, errdefs.ErrInvalidArgument)
	}
	fi, err := os.Stat(p)
	if err != nil {
		return nil, osErr("list", p, err)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("list %s: not a directory: %w", p, errdefs.ErrInvalidArgument)
	}
	var out []Entry
	err = filepath.WalkDir(p, func(q string, d fs.DirEntry, err error) error {
		if q == p {
			return err
		}
		if err != nil {
			return nil // removed meanwhile, or unreadable: skip it
		}
		rel, _ := filepath.Rel(p, q)
		level := 1
		for _, c := range rel {
			if c == filepath.Separator {
				level++
			}
		}
		info, ierr := d.Info()
		if ierr == nil {
			if len(out) == MaxWalkEntries {
				return errTooMany
			}
			out = append(out, entryOf(q, info))
		}
		if d.IsDir() && level >= depth {
			return filepath.SkipDir
		}
		return nil
	})
	if errors.Is(err, errTooMany) {
		return nil, fmt.Errorf("list %s: more than %d entries to depth %d: %w", p, MaxWalkEntries, depth, errdefs.ErrResourceExhausted)
	}
	if err != nil {
		return nil, osErr("list", p, err)
	}
	return out, nil
}

var errTooMany = errors.New("too many entries")

// writeEntries sends entries as data frames of JSON arrays, then their
// count as the result (as a streamed list does).
func writeEntries(fw *frameWriter, ents []Entry) error {
	for len(ents) > 0 {
		n := min(len(ents), 200)
		if err := fw.writeJSON(frameData, ents[:n]); err != nil {
			return err
		}
		ents = ents[n:]
	}
	return fw.writeJSON(frameResult, listResult{Count: -1})
}

// handleSignal sends a signal to a running exec's process group; SIGKILL
// kills it as a timeout does (its whole session, for a pty exec). Only execs
// the agent started can be signalled.
func (s *Server) handleSignal(fw *frameWriter, hdr *request) error {
	if hdr.Signal < 1 || hdr.Signal > 31 {
		return fmt.Errorf("signal %d: not a signal number: %w", hdr.Signal, errdefs.ErrInvalidArgument)
	}
	s.mu.Lock()
	st := s.execs[hdr.Pid]
	s.mu.Unlock()
	if st == nil {
		return fmt.Errorf("signal: no running exec with pid %d: %w", hdr.Pid, errdefs.ErrNotFound)
	}
	// An exec stays in s.execs until its handler returns, after its
	// result went out: one that has exited is NotFound whatever the
	// signal (a caller that has the result must not get a success).
	st.mu.Lock()
	exited := st.exited
	st.mu.Unlock()
	if exited {
		return fmt.Errorf("signal: exec %d has exited: %w", hdr.Pid, errdefs.ErrNotFound)
	}
	sig := syscall.Signal(hdr.Signal)
	if sig == syscall.SIGKILL {
		st.killGroup()
		return fw.writeJSON(frameResult, struct{}{})
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.exited {
		return fmt.Errorf("signal: exec %d has exited: %w", hdr.Pid, errdefs.ErrNotFound)
	}
	if err := syscall.Kill(-st.pid, sig); err != nil {
		return osErr("signal", strconv.Itoa(st.pid), err)
	}
	return fw.writeJSON(frameResult, struct{}{})
}
