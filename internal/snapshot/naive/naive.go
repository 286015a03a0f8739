// Package naive is the snapshotter backend for hosts that cannot use btrfs:
// snapshots are plain directories, and Commit and Prepare-from-parent copy
// the whole upper layer (`cp -a --reflink=auto`, so reflink-capable
// filesystems such as XFS share blocks). Forks therefore cost O(data).
package naive

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/snapshot"
	"github.com/forkbox/forkbox/internal/snapshot/storage"
)

// Snapshotter is the copying snapshotter. It implements
// snapshot.Snapshotter.
type Snapshotter struct {
	*storage.Store
}

var _ snapshot.Snapshotter = (*Snapshotter)(nil)

// Open opens the copying snapshotter at root (created if missing). It logs a
// warning that forks copy data.
func Open(ctx context.Context, root string, log *slog.Logger) (*Snapshotter, error) {
	if log == nil {
		log = slog.Default()
	}
	root, err := filepath.Abs(root)
	if err != nil {
		return nil, fmt.Errorf("snapshot root: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	if _, err := exec.LookPath("cp"); err != nil {
		return nil, fmt.Errorf("cp not found: %w", errdefs.ErrUnavailable)
	}
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, fmt.Errorf("create snapshot root: %v: %w", err, errdefs.ErrInternal)
	}
	log.WarnContext(ctx, "copy snapshotter: commits and forks copy the whole writable layer, O(data)", slog.String("root", root))
	st, err := storage.Open(ctx, root, backend{}, log)
	if err != nil {
		return nil, err
	}
	return &Snapshotter{Store: st}, nil
}

type backend struct{}

func (backend) Create(_ context.Context, dst string) error {
	if err := os.Mkdir(dst, 0o700); err != nil {
		return fmt.Errorf("create %s: %v: %w", dst, err, errdefs.ErrInternal)
	}
	return nil
}

// Clone copies src to dst keeping owners, modes, times, xattrs (overlay's
// opaque markers), hard links and device nodes (whiteouts).
// readonly is not enforced: plain directories have no read-only flag that
// root respects, and the store never writes a committed snapshot. The copy
// is synced to disk (syncfs) before Clone returns.
func (backend) Clone(ctx context.Context, src, dst string, readonly bool) error {
	out, err := exec.CommandContext(ctx, "cp", "-a", "--reflink=auto", "--", src, dst).CombinedOutput()
	if err != nil {
		_ = os.RemoveAll(dst)
		return fmt.Errorf("copy %s to %s: %v: %s: %w", src, dst, err, bytes.TrimSpace(out), errdefs.ErrInternal)
	}
	fd, err := unix.Open(dst, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err == nil {
		err = unix.Syncfs(fd)
		unix.Close(fd)
	}
	if err != nil {
		_ = os.RemoveAll(dst)
		return fmt.Errorf("sync copy %s: %v: %w", dst, err, errdefs.ErrInternal)
	}
	return nil
}

// Unseal does nothing; see Clone.
func (backend) Unseal(context.Context, string) error { return nil }

// Limit refuses: plain directories have no per-directory limit this
// backend could set on any host filesystem (project quotas need ext4 or XFS
// mounted with them), and a limit that is not enforced must not be
// accepted.
func (backend) Limit(context.Context, string, int64) error {
	return fmt.Errorf("the copy snapshotter cannot limit a sandbox's disk use (use the btrfs snapshotter): %w", errdefs.ErrFailedPrecondition)
}

func (backend) Delete(_ context.Context, dir string) error {
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("remove %s: %v: %w", dir, err, errdefs.ErrInternal)
	}
	return nil
}
