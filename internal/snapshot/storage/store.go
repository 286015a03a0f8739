// Package storage is the on-disk engine shared by the snapshotter backends:
// layout, metadata, crash safety and overlay mounts. A backend supplies only
// how to create, clone, seal and delete one snapshot directory.
//
// Layout under the root:
//
//	meta/<key>.json   the snapshot's Info; its presence is the commit point
//	active/<key>/     writable snapshot: upper/, work/
//	committed/<name>/ read-only snapshot: upper/, work/
//	tmp/              tombstones being deleted; swept on Open
//	lock              flock held while a Store is open
//
// A snapshot's data directory is built in place first (a btrfs snapshot
// ioctl commits its own transaction, so it is durable when it returns), then
// meta/<key>.json is written (temp file, fsync, rename, fsync dir). A crash
// before that leaves a data directory without metadata, which Open deletes.
// Remove deletes the metadata first, then renames the data directory to a
// tombstone in tmp/ and deletes it. Moving a directory into place would need
// a directory fsync that costs btrfs a full transaction commit, and btrfs
// cannot move a read-only subvolume, hence this order.
package storage

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/snapshot"
)

// Backend creates and deletes snapshot directories. All paths are absolute
// and on the same filesystem; dst never exists beforehand.
type Backend interface {
	// Create makes an empty writable directory dst.
	Create(ctx context.Context, dst string) error
	// Clone makes dst a copy of directory src, read-only if readonly
	// (where supported). When Clone returns, dst is durable.
	Clone(ctx context.Context, src, dst string, readonly bool) error
	// Unseal makes dir writable again, so that it can be renamed to a
	// tombstone. It is idempotent.
	Unseal(ctx context.Context, dir string) error
	// Delete removes dir and everything in it. It is called on sealed
	// directories too.
	Delete(ctx context.Context, dir string) error
	// Limit limits the bytes that dir, made by Create or by a writable
	// Clone, may hold of its own (see snapshot.Snapshotter.Prepare). A
	// backend that cannot enforce limits returns FailedPrecondition.
	Limit(ctx context.Context, dir string, bytes int64) error
}

// Charger is a Backend that can tell what a directory made by Create or
// Clone holds of its own, as its limit counts it. ok false: not known
// (no limits on the filesystem); Store.Charged measures Usage instead.
type Charger interface {
	Charged(ctx context.Context, dir string) (n int64, ok bool, err error)
}

// Reclaimer is a Backend whose filesystem returns removed snapshots' space
// in the background. Reclaim returns what has been removed so far, waiting
// until ctx ends at most; freed is whether it gave back enough that
// another round may be worth it. Store calls it (without its lock) when a
// Prepare fails ResourceExhausted, then tries again (retryFull).
type Reclaimer interface {
	Reclaim(ctx context.Context) (freed bool, err error)
}

// reclaimBudget bounds the time a Prepare spends waiting for a full pool's
// space to come back, and reclaimRounds its tries.
const (
	reclaimBudget = 10 * time.Second
	reclaimRounds = 5
)

const (
	dirMeta      = "meta"
	dirActive    = "active"
	dirCommitted = "committed"
	dirTmp       = "tmp"
)

var keyRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._@+-]{0,199}$`)

// Store implements snapshot.Snapshotter over a Backend.
type Store struct {
	root    string
	backend Backend
	log     *slog.Logger
	lock    *os.File

	mu        sync.Mutex
	receiving map[string]bool // names being received (receive.go)
}

var _ snapshot.Snapshotter = (*Store)(nil)

// Open opens (creating if needed) a store at root and sweeps the leftovers
// of interrupted operations. root must be absolute.
func Open(ctx context.Context, root string, b Backend, log *slog.Logger) (*Store, error) {
	if log == nil {
		log = slog.Default()
	}
	if !filepath.IsAbs(root) {
		return nil, fmt.Errorf("snapshot root %q is not absolute: %w", root, errdefs.ErrInvalidArgument)
	}
	for _, d := range []string{dirMeta, dirActive, dirCommitted, dirTmp} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o700); err != nil {
			return nil, fmt.Errorf("create snapshot dir: %w", errdefs.ErrInternal)
		}
	}
	lock, err := os.OpenFile(filepath.Join(root, "lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open lock: %v: %w", err, errdefs.ErrInternal)
	}
	if err := lockRoot(ctx, lock, root); err != nil {
		lock.Close()
		return nil, err
	}
	s := &Store{root: root, backend: b, log: log, lock: lock}
	if err := s.sweep(ctx); err != nil {
		lock.Close()
		return nil, err
	}
	if err := s.sweepOrphans(ctx); err != nil {
		lock.Close()
		return nil, err
	}
	return s, nil
}

// Root returns the store's root directory.
func (s *Store) Root() string { return s.root }

// sweep deletes everything in tmp/ (half-built snapshots and tombstones)
// and the metadata files a crash left half written (writeMeta's .tmp:
// its rename is the commit point).
func (s *Store) sweep(ctx context.Context) error {
	metas, err := os.ReadDir(filepath.Join(s.root, dirMeta))
	if err != nil {
		return fmt.Errorf("read meta: %v: %w", err, errdefs.ErrInternal)
	}
	for _, e := range metas {
		if strings.HasSuffix(e.Name(), ".json.tmp") {
			if err := os.Remove(filepath.Join(s.root, dirMeta, e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("sweep %s: %v: %w", e.Name(), err, errdefs.ErrInternal)
			}
		}
	}
	ents, err := os.ReadDir(filepath.Join(s.root, dirTmp))
	if err != nil {
		return fmt.Errorf("read tmp: %v: %w", err, errdefs.ErrInternal)
	}
	for _, e := range ents {
		p := filepath.Join(s.root, dirTmp, e.Name())
		s.log.InfoContext(ctx, "removing leftover snapshot dir", slog.String("path", p))
		if err := s.backend.Delete(ctx, p); err != nil {
			return fmt.Errorf("sweep %s: %w", p, err)
		}
	}
	return nil
}

// sweepOrphans deletes data directories that have no metadata (a crash
// before the commit point) and metadata whose data directory is gone.
func (s *Store) sweepOrphans(ctx context.Context) error {
	infos, err := s.readAllMeta(ctx)
	if err != nil {
		return err
	}
	known := make(map[string]bool, len(infos))
	for _, in := range infos {
		dir := s.dataDir(in)
		if _, err := os.Lstat(dir); errors.Is(err, fs.ErrNotExist) {
			s.log.WarnContext(ctx, "snapshot data missing; dropping its metadata", slog.String("snapshot", in.Key))
			if err := os.Remove(s.metaPath(in.Key)); err != nil {
				return fmt.Errorf("drop metadata of %q: %v: %w", in.Key, err, errdefs.ErrInternal)
			}
			continue
		}
		known[dir] = true
	}
	for _, d := range []string{dirActive, dirCommitted} {
		ents, err := os.ReadDir(filepath.Join(s.root, d))
		if err != nil {
			return fmt.Errorf("read %s: %v: %w", d, err, errdefs.ErrInternal)
		}
		for _, e := range ents {
			p := filepath.Join(s.root, d, e.Name())
			if known[p] {
				continue
			}
			s.log.InfoContext(ctx, "removing snapshot dir without metadata", slog.String("path", p))
			if err := s.backend.Delete(ctx, p); err != nil {
				return fmt.Errorf("sweep %s: %w", p, err)
			}
		}
	}
	return nil
}

// Close releases the store's lock.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lock == nil {
		return nil
	}
	err := s.lock.Close()
	s.lock = nil
	return err
}

func validKey(key string) error {
	if !keyRE.MatchString(key) {
		return fmt.Errorf("snapshot key %q: must match %s: %w", key, keyRE, errdefs.ErrInvalidArgument)
	}
	return nil
}

func (s *Store) metaPath(key string) string {
	return filepath.Join(s.root, dirMeta, key+".json")
}

func (s *Store) dataDir(in snapshot.Info) string {
	if in.Kind == snapshot.KindCommitted {
		return filepath.Join(s.root, dirCommitted, in.Key)
	}
	return filepath.Join(s.root, dirActive, in.Key)
}

// find returns the data directory and info of snapshot key.
func (s *Store) find(key string) (string, snapshot.Info, error) {
	if err := validKey(key); err != nil {
		return "", snapshot.Info{}, err
	}
	info, err := readMeta(s.metaPath(key))
	if errors.Is(err, fs.ErrNotExist) {
		return "", snapshot.Info{}, fmt.Errorf("snapshot %q: %w", key, errdefs.ErrNotFound)
	}
	if err != nil {
		return "", snapshot.Info{}, err
	}
	return s.dataDir(info), info, nil
}

func (s *Store) checkFree(key string) error {
	if s.receiving[key] {
		return fmt.Errorf("snapshot %q is being received: %w", key, errdefs.ErrAlreadyExists)
	}
	_, _, err := s.find(key)
	switch {
	case err == nil:
		return fmt.Errorf("snapshot %q: %w", key, errdefs.ErrAlreadyExists)
	case errdefs.IsNotFound(err):
		return nil
	}
	return err
}

func readMeta(path string) (snapshot.Info, error) {
	var info snapshot.Info
	b, err := os.ReadFile(path)
	if err != nil {
		return info, err
	}
	if err := json.Unmarshal(b, &info); err != nil {
		return info, fmt.Errorf("snapshot metadata %s: %v: %w", path, err, errdefs.ErrInternal)
	}
	return info, nil
}

// writeMeta durably writes the metadata of info: the commit point of
// Prepare and Commit.
func (s *Store) writeMeta(info snapshot.Info) error {
	b, err := json.Marshal(info)
	if err != nil {
		return err
	}
	dst := s.metaPath(info.Key)
	tmp := dst + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, dst); err != nil {
		return err
	}
	return syncDir(filepath.Dir(dst))
}

// readAllMeta reads every snapshot's metadata, skipping unreadable files.
func (s *Store) readAllMeta(ctx context.Context) ([]snapshot.Info, error) {
	ents, err := os.ReadDir(filepath.Join(s.root, dirMeta))
	if err != nil {
		return nil, fmt.Errorf("list snapshots: %v: %w", err, errdefs.ErrInternal)
	}
	var out []snapshot.Info
	for _, e := range ents {
		name, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok {
			continue // a .tmp left by a crash
		}
		info, err := readMeta(filepath.Join(s.root, dirMeta, e.Name()))
		if err != nil || info.Key != name {
			s.log.WarnContext(ctx, "skipping bad snapshot metadata", slog.String("snapshot", name), slog.Any("err", err))
			continue
		}
		out = append(out, info)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}

func (s *Store) tmpPath(prefix string) string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return filepath.Join(s.root, dirTmp, prefix+hex.EncodeToString(b[:]))
}

func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// resetWork empties dir/work (overlay's scratch dir) and makes sure
// dir/upper exists.
func resetWork(dir string) error {
	work := filepath.Join(dir, "work")
	if err := os.RemoveAll(work); err != nil {
		return err
	}
	if err := os.Mkdir(work, 0o700); err != nil {
		return err
	}
	return os.MkdirAll(filepath.Join(dir, "upper"), 0o755)
}

func newInfo(key, parent string, kind snapshot.Kind, opts []snapshot.Opt) (snapshot.Info, error) {
	info := snapshot.Info{Key: key, Parent: parent, Kind: kind, Created: time.Now().UTC()}
	for _, o := range opts {
		o(&info)
	}
	switch {
	case info.DiskLimit < 0:
		return info, fmt.Errorf("snapshot %q: disk limit %d: %w", key, info.DiskLimit, errdefs.ErrInvalidArgument)
	case info.DiskLimit > 0 && kind == snapshot.KindCommitted:
		return info, fmt.Errorf("snapshot %q: a committed snapshot takes no disk limit: %w", key, errdefs.ErrInvalidArgument)
	}
	return info, nil
}

// ioClass is the class of an error from writing the store's own files: a
// full filesystem (or quota) is ResourceExhausted, anything else Internal.
func ioClass(err error) error {
	if errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT) {
		return errdefs.ErrResourceExhausted
	}
	return errdefs.ErrInternal
}

// Stat implements snapshot.Snapshotter.
func (s *Store) Stat(ctx context.Context, key string) (snapshot.Info, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, info, err := s.find(key)
	return info, err
}

// List implements snapshot.Snapshotter.
func (s *Store) List(ctx context.Context) ([]snapshot.Info, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.readAllMeta(ctx)
}

// retryFull runs op; if it fails ResourceExhausted on a backend that
// reclaims space in the background, it reclaims and runs op again, so that
// a create right after a removal freed the pool does not fail for space the
// filesystem has not yet given back. It goes on while a round gave space
// back (btrfs sometimes needs another commit before the space is usable),
// for reclaimBudget and reclaimRounds at most. A pool that is really full
// fails after one round, with op's error.
func (s *Store) retryFull(ctx context.Context, op func() error) error {
	err := op()
	r, ok := s.backend.(Reclaimer)
	if !ok || !errdefs.IsResourceExhausted(err) {
		return err
	}
	rctx, cancel := context.WithTimeout(ctx, reclaimBudget)
	defer cancel()
	for round := 1; ; round++ {
		freed, rerr := r.Reclaim(rctx)
		if rerr != nil {
			s.log.WarnContext(ctx, "reclaim removed snapshots' space", slog.Any("err", rerr))
			return err
		}
		switch again := op(); {
		case again == nil:
			return nil
		case !errdefs.IsResourceExhausted(again):
			// Something the first attempt left (its undo failed on the
			// full pool) or a concurrent call: the pool's state is the
			// answer.
			s.log.WarnContext(ctx, "retry after reclaiming space", slog.Any("err", again))
			return err
		case !freed || round == reclaimRounds || rctx.Err() != nil:
			return fmt.Errorf("%w (again after waiting for removed snapshots' space)", again)
		}
	}
}
