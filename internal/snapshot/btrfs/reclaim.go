package btrfs

import (
	"context"
	"encoding/binary"
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
	rootItemKey    = 132                // BTRFS_ROOT_ITEM_KEY
	spaceGlobalRsv = 1 << 49            // BTRFS_SPACE_INFO_GLOBAL_RSV: a reservation, not space in use
	spaceSlots     = 16                 // more than the kinds of block groups a filesystem has

	reclaimProgress  = 1 << 20         // bytes a round must give back to be worth another
	reclaimStall     = 2 * time.Second // how long a wait goes on without the cleaner moving
	searchHeaderSize = 32              // struct btrfs_ioctl_search_header: transid, objectid, offset, type, len
)

// searchArgs is struct btrfs_ioctl_search_args: struct
// btrfs_ioctl_search_key, then the buffer the items come back in, each a
// struct btrfs_ioctl_search_header and its data.
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
// commits the filesystem's transaction, waits until the cleaner has
// dropped every deleted subvolume, and commits again. It implements
// storage.Reclaimer: freed is whether the round gave back reclaimProgress
// or more, so that another round may be worth it (the undo of a failed
// create, an empty subvolume, gives back less).
//
// A deleted subvolume is pending from its deletion until the cleaner has
// dropped all of it: the root tree holds an orphan item for it meanwhile,
// and its root item until the end (what `btrfs subvolume sync` waits on).
// The kernel's own count of the cleaner's queue (BTRFS_IOC_SUBVOL_SYNC_WAIT,
// Linux 6.8+) misses a subvolume whose last inodes are still being written
// back: it joins the queue only when they are evicted. The wait commits
// once a second (a commit wakes the cleaner), and ends with ctx, or when
// neither the pending subvolumes nor the space in use have moved for
// reclaimStall (a subvolume kept from the cleaner, by an open file say).
func (b *backend) Reclaim(ctx context.Context) (freed bool, err error) {
	fd, err := openDir(b.root)
	if err != nil {
		return false, wrap("open", b.root, err)
	}
	defer unix.Close(fd)
	// Read before the commit that wakes the cleaner, so that what it drops
	// from then on counts (others' dirty data that the commit writes can
	// hide a drop: then the caller tries once, as without a wait).
	before, err := spaceUsed(fd)
	if err != nil {
		return false, err
	}
	if err := b.commit(fd); err != nil {
		return false, err
	}
	pending, err := pendingDeletions(fd)
	if err != nil {
		return false, err
	}
	used := before
	poll := 5 * time.Millisecond
	synced, moved := time.Now(), time.Now()
	for pending > 0 {
		t := time.NewTimer(poll)
		select {
		case <-ctx.Done():
			t.Stop()
		case <-t.C:
		}
		if ctx.Err() != nil {
			b.log.DebugContext(ctx, "btrfs cleaner still busy", "root", b.root, "pending", pending)
			break // what it did drop comes back with the commit below
		}
		poll = min(2*poll, 100*time.Millisecond)
		if time.Since(synced) >= time.Second {
			if err := b.commit(fd); err != nil {
				return false, err
			}
			synced = time.Now()
		}
		p, err := pendingDeletions(fd)
		if err != nil {
			return false, err
		}
		u, err := spaceUsed(fd)
		if err != nil {
			return false, err
		}
		if p != pending || u != used {
			pending, used, moved = p, u, time.Now()
		} else if time.Since(moved) >= reclaimStall {
			b.log.DebugContext(ctx, "btrfs cleaner makes no progress", "root", b.root, "pending", pending)
			break
		}
	}
	if err := b.commit(fd); err != nil {
		return false, err
	}
	after, err := spaceUsed(fd)
	if err != nil {
		return false, err
	}
	return after+reclaimProgress <= before, nil
}

// commit commits the transaction of the filesystem open at fd, writing
// back its dirty data first (BTRFS_IOC_SYNC); it wakes the cleaner.
func (b *backend) commit(fd int) error {
	if err := ioctl(fd, iocSync, nil); err != nil {
		return wrap("sync", b.root, err)
	}
	return nil
}

// pendingDeletions is how many deleted subvolumes of the filesystem open
// at fd are not dropped yet: orphan items of the root tree whose subvolume
// still has its root item (an orphan item without one is a stale leftover,
// of an old free-space cache say, that no cleaner will remove). It counts
// what one search returns, which is enough to tell none from some.
func pendingDeletions(fd int) (int, error) {
	var a searchArgs
	if err := searchRootTree(fd, orphanObjectID, orphanItemKey, 4096, &a); err != nil {
		return 0, fmt.Errorf("btrfs search deleted subvolumes: %v: %w", err, errdefs.ErrInternal)
	}
	n := 0
	for i, off := uint32(0), 0; i < a.nrItems && off+searchHeaderSize <= len(a.buf); i++ {
		h := a.buf[off : off+searchHeaderSize]
		id := binary.NativeEndian.Uint64(h[16:24]) // the header's offset: the subvolume's id
		off += searchHeaderSize + int(binary.NativeEndian.Uint32(h[28:32]))
		exists, err := hasRootItem(fd, id)
		if err != nil {
			return 0, err
		}
		if exists {
			n++
		}
	}
	return n, nil
}

// hasRootItem reports whether the root tree holds subvolume id's root item.
func hasRootItem(fd int, id uint64) (bool, error) {
	var a searchArgs
	if err := searchRootTree(fd, id, rootItemKey, 1, &a); err != nil {
		return false, fmt.Errorf("btrfs search subvolume %d: %v: %w", id, err, errdefs.ErrInternal)
	}
	return a.nrItems > 0, nil
}

// searchRootTree fills a with at most n of the root tree's items of object
// objectID and key type keyType (BTRFS_IOC_TREE_SEARCH); a.nrItems is how
// many came back.
func searchRootTree(fd int, objectID uint64, keyType, n uint32, a *searchArgs) error {
	*a = searchArgs{treeID: rootTreeID, minObjectID: objectID, maxObjectID: objectID,
		maxOffset: ^uint64(0), maxTransID: ^uint64(0), minType: keyType, maxType: keyType, nrItems: n}
	return ioctl(fd, iocTreeSearch, unsafe.Pointer(a))
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
