package btrfs

import (
	"context"
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
	iocSync       = 0x9408     // _IO(0x94, 8)
	iocTreeSearch = 0xd0009411 // _IOWR(0x94, 17, struct btrfs_ioctl_search_args)
	iocSpaceInfo  = 0xc0109414 // _IOWR(0x94, 20, struct btrfs_ioctl_space_args)

	rootTreeID     = 1                  // BTRFS_ROOT_TREE_OBJECTID
	orphanObjectID = 0xfffffffffffffffb // BTRFS_ORPHAN_OBJECTID (-5)
	orphanItemKey  = 48                 // BTRFS_ORPHAN_ITEM_KEY
	spaceGlobalRsv = 1 << 49            // BTRFS_SPACE_INFO_GLOBAL_RSV: a reservation, not space in use
	spaceSlots     = 16                 // more than the kinds of block groups a filesystem has

	reclaimProgress = 1 << 20 // bytes a round must give back to be worth another
)

// searchArgs is struct btrfs_ioctl_search_args: struct
// btrfs_ioctl_search_key, then the buffer the items come back in (only
// their count is read).
type searchArgs struct {
	treeID, minObjectID, maxObjectID, minOffset, maxOffset, minTransID, maxTransID uint64
	minType, maxType, nrItems, unused                                              uint32
	unused1                                                                        [4]uint64
	buf                                                                            [4096 - 104]byte
}

// spaceArgs is struct btrfs_ioctl_space_args with room for spaceSlots
// struct btrfs_ioctl_space_info {flags, total_bytes, used_bytes}.
type spaceArgs struct {
	slots, total uint64
	spaces       [spaceSlots][3]uint64
}

var (
	_ [4096 - unsafe.Sizeof(searchArgs{})]byte
	_ [unsafe.Sizeof(searchArgs{}) - 4096]byte
	_ [16 + spaceSlots*24 - unsafe.Sizeof(spaceArgs{})]byte
	_ [unsafe.Sizeof(spaceArgs{}) - 16 - spaceSlots*24]byte
)

// Reclaim returns to the pool the space of what was removed from it: it
// commits the filesystem's transaction, waits (until ctx ends) until the
// cleaner has dropped every deleted subvolume, committing meanwhile (a
// commit wakes the cleaner), and commits again. It implements
// storage.Reclaimer: freed is whether the round gave back reclaimProgress
// or more, so that another round may be worth it (the undo of a failed
// create, an empty subvolume, gives back less).
//
// A deleted subvolume is pending from its deletion until the cleaner has
// dropped all of it: the root tree holds an orphan item for it meanwhile
// (what `btrfs subvolume sync` waits on). The kernel's own count of the
// cleaner's queue (BTRFS_IOC_SUBVOL_SYNC_WAIT, Linux 6.8+) misses a
// subvolume whose last inodes are still being written back: it joins the
// queue only when they are evicted.
func (b *backend) Reclaim(ctx context.Context) (freed bool, err error) {
	fd, err := openDir(b.root)
	if err != nil {
		return false, wrap("open", b.root, err)
	}
	defer unix.Close(fd)
	before, err := spaceUsed(fd)
	if err != nil {
		return false, err
	}
	if err := ioctl(fd, iocSync, nil); err != nil {
		return false, wrap("sync", b.root, err)
	}
	pending, err := pendingDeletions(fd)
	if err != nil {
		return false, err
	}
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
		if err := ioctl(fd, iocSync, nil); err != nil {
			return false, wrap("sync", b.root, err)
		}
		if pending, err = pendingDeletions(fd); err != nil {
			return false, err
		}
	}
	if err := ioctl(fd, iocSync, nil); err != nil {
		return false, wrap("sync", b.root, err)
	}
	after, err := spaceUsed(fd)
	if err != nil {
		return false, err
	}
	return after+reclaimProgress <= before, nil
}

// pendingDeletions is how many deleted subvolumes of the filesystem open
// at fd are not dropped yet (their orphan items in the root tree; at most
// what one search returns, which is enough to tell none from some).
func pendingDeletions(fd int) (uint32, error) {
	a := searchArgs{treeID: rootTreeID, minObjectID: orphanObjectID, maxObjectID: orphanObjectID,
		maxOffset: ^uint64(0), maxTransID: ^uint64(0), minType: orphanItemKey, maxType: orphanItemKey, nrItems: 4096}
	if err := ioctl(fd, iocTreeSearch, unsafe.Pointer(&a)); err != nil {
		return 0, fmt.Errorf("btrfs search deleted subvolumes: %v: %w", err, errdefs.ErrInternal)
	}
	return a.nrItems, nil
}

// spaceUsed is the bytes in use in the block groups of the filesystem open
// at fd (data, metadata and system; BTRFS_IOC_SPACE_INFO).
func spaceUsed(fd int) (uint64, error) {
	a := spaceArgs{slots: spaceSlots}
	if err := ioctl(fd, iocSpaceInfo, unsafe.Pointer(&a)); err != nil {
		return 0, fmt.Errorf("btrfs space info: %v: %w", err, errdefs.ErrInternal)
	}
	var used uint64
	for _, s := range a.spaces[:min(a.total, spaceSlots)] {
		if s[0]&spaceGlobalRsv == 0 {
			used += s[2]
		}
	}
	return used, nil
}
