// Package snapshot defines the snapshotter: the storage of each sandbox's
// writable root filesystem layer and of the committed, read-only snapshots
// that forks are made from.
//
// Vocabulary, as in containerd: a key names an active snapshot (writable,
// owned by exactly one sandbox, never shared); a name names a committed
// snapshot (read-only); parent is the committed snapshot an active one was
// prepared from. Keys and names share one namespace.
//
// A sandbox's rootfs is an overlay: the read-only image layer directories
// (from the image store) are its lowers, and the upper and work directories
// live in the sandbox's active snapshot. A fork commits the active snapshot
// (O(1) on btrfs) and prepares one active snapshot per child from it.
//
// Storage describes mounts, it does not perform them: Mounts returns
// []mount.Mount and the caller hands them to package mount.
//
// Implementations: package btrfs (subvolumes, O(1) commit and prepare) and
// package naive (plain directories and full copies, for hosts without
// btrfs). Both run the conformance suite in package testsuite.
package snapshot

import (
	"context"
	"time"

	"github.com/forkbox/forkbox/internal/mount"
)

// Kind is the kind of a snapshot.
type Kind int

const (
	// KindActive is a writable snapshot, the upper layer of one sandbox.
	KindActive Kind = iota + 1
	// KindCommitted is a read-only snapshot, the source of forks.
	KindCommitted
)

func (k Kind) String() string {
	switch k {
	case KindActive:
		return "active"
	case KindCommitted:
		return "committed"
	}
	return "unknown"
}

// Info describes a snapshot.
type Info struct {
	// Key is the snapshot's key (active) or name (committed).
	Key string `json:"key"`
	// Parent is the committed snapshot this one descends from, or "". For
	// a committed snapshot it is the parent of the active snapshot it was
	// committed from.
	Parent  string    `json:"parent,omitempty"`
	Kind    Kind      `json:"kind"`
	Created time.Time `json:"created"`
	// Labels are free-form metadata set by the caller (sandbox id, ...).
	Labels map[string]string `json:"labels,omitempty"`
	// DiskLimit is the disk limit of an active snapshot in bytes, as set
	// by WithDiskLimit (0: none). Committed snapshots have none.
	DiskLimit int64 `json:"disk_limit,omitempty"`
}

// Snapshotter stores active and committed snapshots.
//
// Rules every implementation keeps:
//   - An active snapshot belongs to one sandbox and is never shared.
//   - A committed snapshot never changes.
//   - Snapshots are independent: removing a committed snapshot does not
//     affect the active snapshots prepared from it.
//   - Errors carry errdefs classes: InvalidArgument for a bad key,
//     AlreadyExists, NotFound, FailedPrecondition for an operation on the
//     wrong kind or on a snapshot that is still mounted.
//   - State survives a restart: a new Snapshotter on the same root sees the
//     same snapshots; a crash in the middle of an operation leaves nothing
//     that the next open does not clean.
//
// A Snapshotter is safe for concurrent use.
type Snapshotter interface {
	// Prepare creates the active snapshot key: an empty writable layer
	// when parent is "", otherwise a writable copy of the committed
	// snapshot parent.
	//
	// With WithDiskLimit(n), n > 0, the snapshot may hold at most about n
	// bytes of its own: a write through its mounts that would go past the
	// limit fails with EDQUOT (or ENOSPC), inside a sandbox as on the
	// host. Only what is written into key counts, never the data it shares
	// with parent, so a snapshot prepared from a committed snapshot of any
	// size starts at zero, and removing parent later does not charge key
	// for the data they shared. The limit is enforced by the filesystem at
	// allocation time: a write may go past it by up to one allocation
	// unit per writer before EDQUOT. An implementation that cannot enforce
	// a limit fails Prepare with FailedPrecondition and creates nothing.
	Prepare(ctx context.Context, key, parent string, opts ...Opt) error

	// Mounts returns the mounts that make the root filesystem of active
	// snapshot key: an overlay whose upper layer is key and whose lower
	// layers are lowers, given BASE FIRST (lowers[0] is the bottom image
	// layer, as the image store returns them). With no lowers the result
	// is a bind mount of the upper directory.
	Mounts(ctx context.Context, key string, lowers []string) ([]mount.Mount, error)

	// Commit captures the current content of active snapshot key as the
	// committed snapshot name. Unlike containerd, key stays active and
	// usable: a fork checkpoints a live sandbox. The caller stops writers
	// (freezes the sandbox) first. A committed snapshot never changes, so
	// it has no disk limit; WithDiskLimit is an InvalidArgument here. key
	// keeps its own limit. Commit is O(1) with or without limits on btrfs.
	Commit(ctx context.Context, name, key string, opts ...Opt) error

	// Stat returns the snapshot key.
	Stat(ctx context.Context, key string) (Info, error)

	// List returns all snapshots, sorted by key.
	List(ctx context.Context) ([]Info, error)

	// Usage returns the bytes used by snapshot key's upper layer, counting
	// each inode once.
	Usage(ctx context.Context, key string) (int64, error)

	// Charged returns the bytes active snapshot key holds of its own, as
	// its disk limit counts them (see Prepare): on btrfs with quotas on,
	// its qgroup's exclusive bytes, which move when btrfs commits a
	// transaction (a sync, or every 30 s); elsewhere, Usage. It is cheap
	// where limits are enforced, so it can be polled.
	Charged(ctx context.Context, key string) (int64, error)

	// Remove deletes snapshot key. It fails with NotFound if there is no
	// such snapshot and with FailedPrecondition if an active snapshot is
	// still mounted.
	Remove(ctx context.Context, key string) error

	// Close releases the Snapshotter. It leaves snapshots and any
	// backing filesystem in place.
	Close() error
}

// WithDiskLimit limits the bytes an active snapshot made by Prepare may
// hold of its own (see Prepare); 0 means no limit, a negative value is an
// InvalidArgument.
func WithDiskLimit(bytes int64) Opt {
	return func(in *Info) { in.DiskLimit = bytes }
}

// Opt sets options on Prepare and Commit.
type Opt func(*Info)

// WithLabels sets labels on the new snapshot.
func WithLabels(labels map[string]string) Opt {
	return func(in *Info) {
		if in.Labels == nil {
			in.Labels = make(map[string]string, len(labels))
		}
		for k, v := range labels {
			in.Labels[k] = v
		}
	}
}
