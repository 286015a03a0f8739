package btrfs

import (
	"context"
	"errors"
	"fmt"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/errdefs"
)

// Space that a removal frees comes back to btrfs in the background: a
// deleted file's extents at the next transaction commit; a deleted
// subvolume's only after the cleaner thread (which a commit wakes) has
// dropped its tree, and then another commit. Until then a create on a pool
// that was full fails with ENOSPC although nothing is left in it.

const (
	iocSync           = 0x9408     // _IO(0x94, 8)
	iocSubvolSyncWait = 0x40109441 // _IOW(0x94, 65, struct btrfs_ioctl_subvol_wait), Linux 6.8+

	subvolSyncCount = 2 // BTRFS_SUBVOL_SYNC_COUNT: how many deleted subvolumes wait for the cleaner
)

// subvolWait is struct btrfs_ioctl_subvol_wait.
type subvolWait struct {
	subvolid uint64
	mode     uint32
	count    uint32
}

var (
	_ [16 - unsafe.Sizeof(subvolWait{})]byte
	_ [unsafe.Sizeof(subvolWait{}) - 16]byte
)

// reclaimWait bounds how long Reclaim waits for the cleaner. Dropping a
// large subvolume's tree can take longer; the caller's retry then fails
// ResourceExhausted as it would have without the wait.
const reclaimWait = 10 * time.Second

// Reclaim returns to the pool the space of what was removed from it: it
// commits the filesystem's transaction, waits (at most reclaimWait, or
// until ctx ends) until the cleaner has dropped every deleted subvolume,
// and commits again. It implements storage.Reclaimer. On kernels before
// 6.8, which cannot tell whether deletions are pending, it only commits.
func (b *backend) Reclaim(ctx context.Context) error {
	fd, err := openDir(b.root)
	if err != nil {
		return wrap("open", b.root, err)
	}
	defer unix.Close(fd)
	if err := ioctl(fd, iocSync, nil); err != nil {
		return wrap("sync", b.root, err)
	}
	pending, err := pendingDeletions(fd)
	if err != nil || pending == 0 {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, reclaimWait)
	defer cancel()
	wait := 5 * time.Millisecond
wait:
	for pending > 0 {
		// The kernel's own wait (BTRFS_SUBVOL_SYNC_WAIT_FOR_QUEUED)
		// sleeps in steps of a second and cannot be cancelled; the count
		// is cheap to read.
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			b.log.DebugContext(ctx, "btrfs cleaner still busy", "root", b.root, "pending", pending)
			break wait // what it did drop comes back with the commit below
		case <-t.C:
		}
		wait = min(2*wait, 200*time.Millisecond)
		if pending, err = pendingDeletions(fd); err != nil {
			return err
		}
	}
	if err := ioctl(fd, iocSync, nil); err != nil {
		return wrap("sync", b.root, err)
	}
	return nil
}

// pendingDeletions is how many deleted subvolumes of the filesystem open
// at fd wait for the cleaner; 0 on a kernel that cannot tell (before 6.8).
func pendingDeletions(fd int) (uint32, error) {
	a := subvolWait{mode: subvolSyncCount}
	if err := ioctl(fd, iocSubvolSyncWait, unsafe.Pointer(&a)); err != nil {
		if errors.Is(err, unix.ENOTTY) || errors.Is(err, unix.EINVAL) {
			return 0, nil
		}
		return 0, fmt.Errorf("btrfs count deleted subvolumes: %v: %w", err, errdefs.ErrInternal)
	}
	return a.count, nil
}
