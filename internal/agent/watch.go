package agent

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"syscall"
	"time"

	"github.com/forkbox/forkbox/errdefs"
)

// Bounds of a watch.
const (
	// MaxWatchEntries bounds the files one watch follows; a tree that grows
	// past it ends the watch with ResourceExhausted.
	MaxWatchEntries = 10000
	// WatchInterval is how often a watch compares the tree with its last
	// look: events arrive at most this late.
	WatchInterval = 100 * time.Millisecond
	// maxWatchBatch bounds the events of one data frame.
	maxWatchBatch = 200
)

// Watch event operations.
const (
	WatchCreate = "create"
	WatchWrite  = "write"
	WatchRemove = "remove"
	WatchRename = "rename"
	WatchChmod  = "chmod"
)

// WatchEvent is one change a watch saw. Entry.Path is relative to the
// watched directory; a removed file's Entry is its last look.
type WatchEvent struct {
	Op    string `json:"op"`
	Entry Entry  `json:"entry"`
}

// look is what a watch remembers of one file.
type look struct {
	entry Entry
	ino   uint64
	ctime int64
}

// scan looks at the directory root: its entries, and with recursive those
// of its subdirectories. It fails past MaxWatchEntries.
func scan(root string, recursive bool) (map[string]look, error) {
	out := map[string]look{}
	err := filepath.WalkDir(root, func(q string, d fs.DirEntry, err error) error {
		if q == root {
			return err
		}
		if err != nil {
			return nil
		}
		info, ierr := d.Info()
		if ierr == nil {
			if len(out) == MaxWatchEntries {
				return errTooMany
			}
			rel, _ := filepath.Rel(root, q)
			e := Entry{Path: rel, Name: info.Name(), Size: info.Size(), Mode: info.Mode(), ModTime: info.ModTime()}
			l := look{entry: e}
			if st, ok := info.Sys().(*syscall.Stat_t); ok {
				l.ino, l.ctime = st.Ino, st.Ctim.Nano()
			}
			out[rel] = l
		}
		if d.IsDir() && !recursive {
			return filepath.SkipDir
		}
		return nil
	})
	if err == errTooMany {
		return nil, fmt.Errorf("watch %s: more than %d entries: %w", root, MaxWatchEntries, errdefs.ErrResourceExhausted)
	}
	if err != nil {
		return nil, osErr("watch", root, err)
	}
	return out, nil
}

// diff returns the events that turn before into after, in path order: a
// file gone whose inode reappears under a new name is a rename (of the old
// name) followed by a create (of the new one).
func diff(before, after map[string]look) []WatchEvent {
	var evs []WatchEvent
	born := map[uint64]bool{}
	for p, a := range after {
		if _, ok := before[p]; !ok && a.ino != 0 {
			born[a.ino] = true
		}
	}
	for p, b := range before {
		if _, ok := after[p]; !ok {
			op := WatchRemove
			if born[b.ino] {
				op = WatchRename
			}
			evs = append(evs, WatchEvent{Op: op, Entry: b.entry})
		}
	}
	for p, a := range after {
		b, ok := before[p]
		switch {
		case !ok:
			evs = append(evs, WatchEvent{Op: WatchCreate, Entry: a.entry})
		case a.entry.Mode.IsRegular() && (a.entry.Size != b.entry.Size || !a.entry.ModTime.Equal(b.entry.ModTime)):
			evs = append(evs, WatchEvent{Op: WatchWrite, Entry: a.entry})
		case a.entry.Mode != b.entry.Mode:
			evs = append(evs, WatchEvent{Op: WatchChmod, Entry: a.entry})
		case a.ctime != b.ctime && a.entry.Mode.IsRegular():
			evs = append(evs, WatchEvent{Op: WatchWrite, Entry: a.entry})
		}
	}
	sort.SliceStable(evs, func(i, j int) bool { return evs[i].Entry.Path < evs[j].Entry.Path })
	return evs
}

// handleWatch watches the directory hdr.Path by looking at it every
// WatchInterval: it answers with a started frame once it has its first
// look, then sends each look's changes as a data frame (a JSON array of
// WatchEvent) until the client closes the connection. The directory's
// removal ends the watch with a result frame.
func (s *Server) handleWatch(body *reqBody, fw *frameWriter, hdr *request) error {
	root, err := checkPath(hdr.Path)
	if err != nil {
		return err
	}
	fi, err := os.Stat(root)
	if err != nil {
		return osErr("watch", root, err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("watch %s: not a directory: %w", root, errdefs.ErrInvalidArgument)
	}
	last, err := scan(root, hdr.Recursive)
	if err != nil {
		return err
	}
	// The client sends nothing more: a read returns when it goes away.
	gone := make(chan struct{})
	conn := body.handOff()
	go func() {
		defer close(gone)
		for {
			if _, err := readFrame(conn); err != nil {
				return
			}
		}
	}()
	defer func() {
		conn.SetReadDeadline(time.Now()) // ends the reader
		<-gone
		conn.SetReadDeadline(time.Time{})
	}()
	if err := fw.writeJSON(frameStarted, struct{}{}); err != nil {
		return err
	}
	t := time.NewTicker(WatchInterval)
	defer t.Stop()
	for {
		select {
		case <-gone:
			return nil
		case <-t.C:
		}
		if _, err := os.Stat(root); err != nil {
			return fw.writeJSON(frameResult, struct{}{})
		}
		now, err := scan(root, hdr.Recursive)
		if err != nil {
			return err
		}
		evs := diff(last, now)
		last = now
		for len(evs) > 0 {
			n := min(len(evs), maxWatchBatch)
			if err := fw.writeJSON(frameData, evs[:n]); err != nil {
				return nil // the client is gone
			}
			evs = evs[n:]
		}
	}
}
