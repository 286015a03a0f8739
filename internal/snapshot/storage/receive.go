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
	if _, err := os.Lstat(filepath.Join(dst, "upper")); err != nil {
		return fmt.Errorf("receive %q: the received data has no upper layer: %v: %w", name, err, errdefs.ErrInvalidArgument)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.writeMeta(info); err != nil {
		return fmt.Errorf("receive %q: metadata: %v: %w", name, err, ioClass(err))
	}
	return nil
}
