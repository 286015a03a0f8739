package storage

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/snapshot"
)

// Receive makes the committed snapshot name from data that comes from
// outside the store (another node's btrfs send). recv is called without
// the store's lock, with the directory the snapshot's data must appear in
// as <dir>/<name> (committed/, where it stays: btrfs can neither move a
// read-only subvolume nor make a received one writable without losing its
// received UUID, which later incremental receives need). It must leave
// nothing else there.
//
// The commit point is the metadata, as for Commit: until it is written
// the data directory is an orphan, deleted here when recv or a check
// fails and by Open after a crash. name is reserved meanwhile: Prepare,
// Commit and another Receive of it fail with AlreadyExists.
func (s *Store) Receive(ctx context.Context, name string, recv func(ctx context.Context, dir string) error, opts ...snapshot.Opt) (retErr error) {
	info, err := newInfo(name, "", snapshot.KindCommitted, opts)
	if err != nil {
		return err
	}
	dst := filepath.Join(s.root, dirCommitted, name)
	s.mu.Lock()
	if err := s.checkFree(name); err != nil {
		s.mu.Unlock()
		return err
	}
	if _, err := os.Lstat(dst); !errors.Is(err, fs.ErrNotExist) {
		s.mu.Unlock()
		return fmt.Errorf("receive %q: a leftover data directory is in the way (the next open sweeps it): %w", name, errdefs.ErrFailedPrecondition)
	}
	if s.receiving == nil {
		s.receiving = map[string]bool{}
	}
	s.receiving[name] = true
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.receiving, name)
		s.mu.Unlock()
	}()
	defer s.undoOnError(ctx, &retErr, dst)
	if err := recv(ctx, filepath.Dir(dst)); err != nil {
		return fmt.Errorf("receive %q: %w", name, err)
	}
	if err := checkReceivedTop(dst); err != nil {
		return fmt.Errorf("receive %q: %w", name, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.writeMeta(info); err != nil {
		return fmt.Errorf("receive %q: metadata: %v: %w", name, err, ioClass(err))
	}
	return nil
}

// checkReceivedTop checks the top of a received checkpoint, which its
// sender wrote: an upper layer and at most overlay's scratch directory,
// both real directories. The store follows those two paths (it makes
// them, overlay mounts them): a symlink there would give a sandbox made
// from it another checkpoint's or a live sandbox's layer, or the store's
// own files.
func checkReceivedTop(dst string) error {
	ents, err := os.ReadDir(dst)
	if err != nil {
		return fmt.Errorf("read the received data: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	upper := false
	for _, e := range ents {
		switch {
		case e.Name() != "upper" && e.Name() != "work":
			return fmt.Errorf("the received data holds %q beside its layer: %w", e.Name(), errdefs.ErrInvalidArgument)
		case e.Type()&fs.ModeType != fs.ModeDir:
			return fmt.Errorf("the received data's %q is not a directory (%v): %w", e.Name(), e.Type(), errdefs.ErrInvalidArgument)
		}
		upper = upper || e.Name() == "upper"
	}
	if !upper {
		return fmt.Errorf("the received data has no upper layer: %w", errdefs.ErrInvalidArgument)
	}
	return nil
}
