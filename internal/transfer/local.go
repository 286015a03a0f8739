package transfer

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/snapshot"
	"github.com/forkbox/forkbox/internal/snapshot/btrfs"
	"golang.org/x/sys/unix"
)

// Ledger is the node's record of its checkpoints (the daemon's SQLite).
type Ledger interface {
	// Record returns the record of checkpoint id as the ledger keeps it,
	// sent to the receiver as is; NotFound when this node has none.
	Record(ctx context.Context, id string) ([]byte, error)
	// Commit records checkpoint id received with record rec (untrusted:
	// the ledger checks it), once its snapshot is committed and its
	// memory image, if any, is at memDir ("" for none). imageDigest is
	// the image the receiver ensured for it (Request.ImageDigest): a
	// record naming another is refused.
	Commit(ctx context.Context, id string, rec []byte, memDir, imageDigest string) error
}

// Local is one node's side of transfers: its btrfs snapshot store, the
// directory of its memory images (<MemRoot>/<checkpoint>/) and its ledger.
type Local struct {
	Snaps   *btrfs.Snapshotter
	MemRoot string
	Ledger  Ledger
	Log     *slog.Logger
	// Images is its image store (images.go); nil serves and fetches no
	// images.
	Images Images
}

// stagingPrefix names memory images being received in MemRoot.
const stagingPrefix = ".recv-"

var idRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._@+-]{0,199}$`)

func validID(id string) error {
	if !idRE.MatchString(id) {
		return fmt.Errorf("checkpoint ID %q: %w", id, errdefs.ErrInvalidArgument)
	}
	return nil
}

// held is a checkpoint this node can send.
type held struct {
	id     string
	path   string // the read-only subvolume
	info   btrfs.SubvolInfo
	memDir string // "" without a memory image
	record []byte
}

// held returns checkpoint id if this node holds it: recorded in its
// ledger, committed in its store. NotFound otherwise.
func (l *Local) held(ctx context.Context, id string) (*held, error) {
	if err := validID(id); err != nil {
		return nil, err
	}
	rec, err := l.Ledger.Record(ctx, id)
	if err != nil {
		return nil, err
	}
	in, err := l.Snaps.Stat(ctx, id)
	if err != nil {
		return nil, err
	}
	if in.Kind != snapshot.KindCommitted {
		return nil, fmt.Errorf("snapshot %s is not committed: %w", id, errdefs.ErrNotFound)
	}
	h := &held{id: id, path: l.Snaps.CommittedPath(id), record: rec}
	if h.info, err = btrfs.Subvolume(h.path); err != nil {
		return nil, err
	}
	if !h.info.ReadOnly {
		return nil, fmt.Errorf("checkpoint %s's subvolume is writable: %w", id, errdefs.ErrInternal)
	}
	if st, err := os.Stat(filepath.Join(l.MemRoot, id)); err == nil && st.IsDir() {
		h.memDir = filepath.Join(l.MemRoot, id)
	}
	return h, nil
}

// ancestor reports whether checkpoint base is an ancestor of checkpoint
// id in this node's snapshot store: id's snapshot, its parent's, and so
// on up (a sandbox's snapshot's parent is the checkpoint it started
// from), at most maxHave generations. A received checkpoint's parents
// are not known here: the chain ends there.
func (l *Local) ancestor(ctx context.Context, id, base string) bool {
	for range maxHave {
		in, err := l.Snaps.Stat(ctx, id)
		if err != nil || in.Parent == "" {
			return false
		}
		if in.Parent == base {
			return true
		}
		id = in.Parent
	}
	return false
}

// uuidHeld returns the checkpoint of this node's store whose subvolume
// has uuid as its own or received UUID ("" when none does).
func (l *Local) uuidHeld(uuid string) (string, error) {
	dir := filepath.Dir(l.Snaps.CommittedPath("x"))
	ents, err := os.ReadDir(dir)
	if err != nil {
		return "", fmt.Errorf("list checkpoints: %v: %w", err, errdefs.ErrInternal)
	}
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		info, err := btrfs.Subvolume(filepath.Join(dir, e.Name()))
		if err != nil {
			continue // not a subvolume (a leftover the next open sweeps)
		}
		if info.UUID == uuid || info.ReceivedUUID == uuid {
			return e.Name(), nil
		}
	}
	return "", nil
}

// room is how many bytes a pull may write here: the free space of each
// file system it writes (the snapshot pool, the memory images' directory)
// less a reserve of a twentieth of it, the least of the two. A sender
// names the size of what it sends; it does not fill the node's disk.
func (l *Local) room() (int64, error) {
	room := int64(math.MaxInt64)
	for _, dir := range []string{filepath.Dir(l.Snaps.CommittedPath("x")), l.MemRoot} {
		var st unix.Statfs_t
		for ; ; dir = filepath.Dir(dir) { // the memory directory may not exist yet
			err := unix.Statfs(dir, &st)
			if err == nil {
				break
			}
			if !errors.Is(err, unix.ENOENT) || dir == filepath.Dir(dir) {
				return 0, fmt.Errorf("free space of %s: %v: %w", dir, err, errdefs.ErrInternal)
			}
		}
		free := int64(st.Bavail) * st.Bsize
		room = min(room, free-int64(st.Blocks)*st.Bsize/20)
	}
	return room, nil
}

// Holds reports whether this node holds checkpoint id.
func (l *Local) Holds(ctx context.Context, id string) bool {
	_, err := l.held(ctx, id)
	return err == nil
}

// Sweep removes memory images left half-received by a crash.
func (l *Local) Sweep(ctx context.Context) error {
	ents, err := os.ReadDir(l.MemRoot)
	if err != nil {
		if os.IsNotExist(err) {
			return nil
		}
		return fmt.Errorf("sweep %s: %v: %w", l.MemRoot, err, errdefs.ErrInternal)
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), stagingPrefix) {
			p := filepath.Join(l.MemRoot, e.Name())
			l.log().InfoContext(ctx, "removing a half-received memory image", slog.String("path", p))
			if err := os.RemoveAll(p); err != nil {
				return fmt.Errorf("sweep %s: %v: %w", p, err, errdefs.ErrInternal)
			}
		}
	}
	return nil
}

func (l *Local) log() *slog.Logger {
	if l.Log == nil {
		return slog.Default()
	}
	return l.Log
}

func (l *Local) stagingDir() (string, error) {
	var b [8]byte
	_, _ = rand.Read(b[:])
	if err := os.MkdirAll(l.MemRoot, 0o700); err != nil {
		return "", fmt.Errorf("memory images: %v: %w", err, errdefs.ErrInternal)
	}
	dir := filepath.Join(l.MemRoot, stagingPrefix+hex.EncodeToString(b[:]))
	if err := os.Mkdir(dir, 0o700); err != nil {
		return "", fmt.Errorf("memory image staging: %v: %w", err, errdefs.ErrInternal)
	}
	return dir, nil
}

// memFiles lists the regular files under dir (relative names), refusing
// anything else (a symlink, a device) and more than max files.
func memFiles(dir string, max int) ([]string, error) {
	var out []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			return nil
		}
		if !d.Type().IsRegular() {
			return fmt.Errorf("%s is not a regular file", p)
		}
		rel, _ := filepath.Rel(dir, p)
		out = append(out, rel)
		if len(out) > max {
			return fmt.Errorf("more than %d files", max)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("memory image %s: %v: %w", dir, err, errdefs.ErrInternal)
	}
	return out, nil
}
