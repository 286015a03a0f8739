// Package btrfs is the snapshotter backend that keeps each snapshot in its
// own btrfs subvolume, so that Commit and Prepare-from-parent are O(1)
// subvolume snapshots whatever the amount of data.
//
// If the root directory is not on btrfs, Open makes a sparse image file
// next to it (<root>.img), attaches it to a loop device that frees itself on
// unmount, formats it with mkfs.btrfs once, and mounts it at root. Close
// leaves it mounted, so a restarted daemon finds it in place; Detach unmounts
// it and frees the loop device. The pool is mounted nosuid and nodev (a
// root already on btrfs gets a nosuid,nodev bind mount on itself), and its
// root directory is 0700.
package btrfs

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/loopdev"
	"github.com/forkbox/forkbox/internal/mount"
	"github.com/forkbox/forkbox/internal/snapshot"
	"github.com/forkbox/forkbox/internal/snapshot/storage"
)

// DefaultLoopSize is the apparent size of a new sparse image file.
const DefaultLoopSize = 16 << 30

// Options configure Open.
type Options struct {
	// LoopSize is the size of the sparse image made when root is not on
	// btrfs. Zero means DefaultLoopSize. Ignored for an existing image.
	LoopSize int64
	// Log receives notices; nil means slog.Default().
	Log *slog.Logger
	// Quota is how disk limits are accounted once the first one is set
	// (see quota.go); the zero value is simple quotas.
	Quota QuotaMode
	// Preallocate allocates a new image file's whole size on the host
	// filesystem up front (fallocate) instead of leaving it sparse. A
	// sparse pool grows as sandboxes write, into the filesystem that also
	// holds the state dir and the ledger, and a host filesystem that fills
	// under it turns the pool's writes into I/O errors; a preallocated pool
	// can never take more than its size, and fills on its own (ENOSPC in
	// the pool, ResourceExhausted from the snapshotter) while the host
	// keeps its free space.
	Preallocate bool
}

// Snapshotter is the btrfs snapshotter. It implements snapshot.Snapshotter.
type Snapshotter struct {
	*storage.Store
}

var _ snapshot.Snapshotter = (*Snapshotter)(nil)

// Open opens the btrfs snapshotter at root, mounting a loop-backed btrfs
// there first when root is not on btrfs already.
func Open(ctx context.Context, root string, opts Options) (*Snapshotter, error) {
	log := opts.Log
	if log == nil {
		log = slog.Default()
	}
	root, err := filepath.Abs(root)
	if err != nil {
		return nil, fmt.Errorf("snapshot root: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, fmt.Errorf("create snapshot root: %v: %w", err, errdefs.ErrInternal)
	}
	onBtrfs, err := isBtrfs(root)
	if err != nil {
		return nil, err
	}
	if !onBtrfs {
		if err := mountImage(ctx, root, opts.LoopSize, opts.Preallocate, log); err != nil {
			return nil, err
		}
	}
	// Whatever mounted the pool (this process, an earlier version, or the
	// host when root is on a btrfs of its own), setuid files and device
	// nodes in sandboxes' layers must mean nothing on the host side.
	if err := mount.Restrict(ctx, root); err != nil {
		return nil, fmt.Errorf("snapshot pool: %w", err)
	}
	if err := os.Chmod(root, 0o700); err != nil {
		return nil, fmt.Errorf("snapshot pool: %v: %w", err, errdefs.ErrInternal)
	}
	st, err := storage.Open(ctx, root, &backend{root: root, quota: opts.Quota, log: log}, log)
	if err != nil {
		return nil, err
	}
	return &Snapshotter{Store: st}, nil
}

func isBtrfs(path string) (bool, error) {
	var fs unix.Statfs_t
	if err := unix.Statfs(path, &fs); err != nil {
		return false, fmt.Errorf("statfs %s: %v: %w", path, err, errdefs.ErrInternal)
	}
	return uint32(fs.Type) == superMagic, nil
}

// imagePath is where the loop image for root lives.
func imagePath(root string) string { return filepath.Clean(root) + ".img" }

// mountImage mounts <root>.img (made and formatted if needed) at root.
func mountImage(ctx context.Context, root string, size int64, prealloc bool, log *slog.Logger) (retErr error) {
	if mp, err := mount.IsMountPoint(root); err != nil {
		return err
	} else if mp {
		return fmt.Errorf("snapshot root %s is a mount point but not btrfs: %w", root, errdefs.ErrFailedPrecondition)
	}
	if size <= 0 {
		size = DefaultLoopSize
	}
	img := imagePath(root)
	created, err := loopdev.CreateImage(img, size, prealloc, func(msg string) { log.WarnContext(ctx, msg) })
	if err != nil {
		return err
	}
	if created {
		defer func() {
			if retErr != nil {
				os.Remove(img)
			}
		}()
	}
	dev, devf, err := loopdev.Attach(ctx, img)
	if err != nil {
		return err
	}
	// Closing our fd after the mount leaves the mount as the device's only
	// user; with AUTOCLEAR the device is freed when it is unmounted.
	defer devf.Close()
	has, err := hasBtrfs(img)
	if err != nil {
		return fmt.Errorf("read %s: %v: %w", img, err, errdefs.ErrInternal)
	}
	if !has {
		if err := mkfs(ctx, dev, prealloc); err != nil {
			return err
		}
	}
	mopts := []string{"noatime", "nosuid", "nodev"}
	if prealloc {
		// Discards would punch the preallocated space back out of the
		// image (a loop device turns them into holes).
		mopts = append(mopts, "nodiscard")
	}
	if err := mount.All(ctx, []mount.Mount{{Type: "btrfs", Source: dev, Options: mopts}}, root); err != nil {
		return fmt.Errorf("mount btrfs image: %w", err)
	}
	log.InfoContext(ctx, "mounted loop-backed btrfs for snapshots",
		slog.String("root", root), slog.String("image", img), slog.String("device", dev),
		slog.Bool("created", created), slog.Int64("size", size))
	return nil
}

// Detach unmounts the loop-backed btrfs at root and frees its loop device
// (loopdev.Release). It is idempotent and does nothing to a root that has
// no image file.
func Detach(ctx context.Context, root string) error {
	root, err := filepath.Abs(root)
	if err != nil {
		return fmt.Errorf("snapshot root: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	return loopdev.Release(ctx, root, imagePath(root))
}

// Supported returns nil if this host can run the btrfs snapshotter, or an
// error of class Unavailable that says why not.
func Supported(ctx context.Context) error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("btrfs snapshotter needs root: %w", errdefs.ErrUnavailable)
	}
	b, err := os.ReadFile("/proc/filesystems")
	if err != nil {
		return fmt.Errorf("read /proc/filesystems: %v: %w", err, errdefs.ErrUnavailable)
	}
	if !strings.Contains(string(b), "\tbtrfs\n") {
		// The module may be loadable on demand.
		if out, err := exec.CommandContext(ctx, "modprobe", "btrfs").CombinedOutput(); err != nil {
			return fmt.Errorf("kernel has no btrfs (modprobe: %v: %s): %w", err, strings.TrimSpace(string(out)), errdefs.ErrUnavailable)
		}
	}
	if _, err := exec.LookPath("mkfs.btrfs"); err != nil {
		return fmt.Errorf("mkfs.btrfs not found (install btrfs-progs): %w", errdefs.ErrUnavailable)
	}
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		return fmt.Errorf("no /dev/loop-control: %w", errdefs.ErrUnavailable)
	}
	return nil
}

// backend does the storage work with subvolumes.
type backend struct {
	root  string
	quota QuotaMode
	log   *slog.Logger

	mu         sync.Mutex
	quotaReady bool // quotas enabled on the filesystem
}

func (*backend) Create(_ context.Context, dst string) error { return createSubvolume(dst) }

func (*backend) Clone(_ context.Context, src, dst string, readonly bool) error {
	return snapshotSubvolume(src, dst, readonly)
}

func (*backend) Unseal(_ context.Context, dir string) error { return setReadonly(dir, false) }

func (*backend) Delete(_ context.Context, dir string) error { return removePath(dir) }

// Limit enables quotas on the filesystem the first time (classic qgroups
// when the kernel has no simple quotas), then limits subvolume dir's
// exclusive bytes.
func (b *backend) Limit(ctx context.Context, dir string, bytes int64) error {
	b.mu.Lock()
	if !b.quotaReady {
		err := enableQuota(b.root, b.quota)
		if errdefs.IsUnavailable(err) && b.quota == QuotaSimple {
			b.log.WarnContext(ctx, "no btrfs simple quotas (kernel 6.7+); using classic qgroups, whose snapshot deletion is slower", slog.Any("err", err))
			b.quota = QuotaClassic
			err = enableQuota(b.root, b.quota)
		}
		if err != nil {
			b.mu.Unlock()
			return err
		}
		b.quotaReady = true
	}
	b.mu.Unlock()
	return setLimit(dir, bytes)
}

// LoopDevices returns the loop devices attached to root's image file.
func LoopDevices(root string) []string {
	root, _ = filepath.Abs(root)
	return loopdev.For(imagePath(root))
}
