package btrfs

import (
	"errors"
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/errdefs"
)

// Disk limits are btrfs quota groups: each active snapshot is a subvolume,
// and so has its own level-0 qgroup, whose limit is set when it is prepared.
//
// Quotas are enabled on the filesystem the first time a limit is set (a
// pool on which nobody asks for a limit is never changed). Simple quotas
// (squota, kernel 6.7+) are preferred: an extent is charged to the
// subvolume that wrote it, for as long as it exists, so
//   - a child prepared from a checkpoint of any size starts at zero and is
//     charged only for what it writes itself;
//   - removing the checkpoint (or the source sandbox) later does not move
//     the shared data onto the child's account, as classic qgroups would
//     (with them, a child's exclusive bytes grow when the last other
//     holder of an extent goes away);
//   - snapshot creation and deletion need no backref walks (classic
//     qgroups account every shared extent at each transaction commit).
//
// The limit is on exclusive bytes (BTRFS_QGROUP_LIMIT_MAX_EXCL); with
// simple quotas exclusive and referenced are the same number. Writes past
// it fail with EDQUOT inside the sandbox. When the kernel lacks simple
// quotas, classic qgroups are enabled instead.

// QuotaMode is how the filesystem accounts disk limits.
type QuotaMode int

const (
	// QuotaSimple uses simple quotas (the default).
	QuotaSimple QuotaMode = iota
	// QuotaClassic uses classic qgroups (backref-walking accounting).
	QuotaClassic
)

const (
	iocQuotaCtl    = 0xc0109428 // _IOWR(0x94, 40, struct btrfs_ioctl_quota_ctl_args)
	iocQgroupLimit = 0x8030942b // _IOR(0x94, 43, struct btrfs_ioctl_qgroup_limit_args)

	quotaCtlEnable       = 1 // BTRFS_QUOTA_CTL_ENABLE
	quotaCtlEnableSimple = 4 // BTRFS_QUOTA_CTL_ENABLE_SIMPLE_QUOTA

	qgroupLimitMaxExcl = 1 << 1 // BTRFS_QGROUP_LIMIT_MAX_EXCL
)

// quotaCtlArgs is struct btrfs_ioctl_quota_ctl_args.
type quotaCtlArgs struct {
	cmd    uint64
	status uint64
}

// qgroupLimitArgs is struct btrfs_ioctl_qgroup_limit_args.
type qgroupLimitArgs struct {
	qgroupid uint64
	flags    uint64
	maxRfer  uint64
	maxExcl  uint64
	rsvRfer  uint64
	rsvExcl  uint64
}

var (
	_ [16 - unsafe.Sizeof(quotaCtlArgs{})]byte
	_ [48 - unsafe.Sizeof(qgroupLimitArgs{})]byte
)

// enableQuota turns quotas on for the filesystem holding dir. Enabling
// quotas that are on already succeeds.
func enableQuota(dir string, mode QuotaMode) error {
	fd, err := openDir(dir)
	if err != nil {
		return wrap("open", dir, err)
	}
	defer unix.Close(fd)
	a := quotaCtlArgs{cmd: quotaCtlEnableSimple}
	if mode == QuotaClassic {
		a.cmd = quotaCtlEnable
	}
	if err := ioctl(fd, iocQuotaCtl, unsafe.Pointer(&a)); err != nil {
		if mode == QuotaSimple && errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("btrfs simple quotas (kernel 6.7+): %v: %w", err, errdefs.ErrUnavailable)
		}
		return wrap("enable quota", dir, err)
	}
	return nil
}

// setLimit limits the exclusive bytes of subvolume path to bytes (0
// removes the limit).
func setLimit(path string, bytes int64) error {
	fd, err := openDir(path)
	if err != nil {
		return wrap("open", path, err)
	}
	defer unix.Close(fd)
	// qgroupid 0: the subvolume the fd is in.
	a := qgroupLimitArgs{flags: qgroupLimitMaxExcl, maxExcl: uint64(bytes)}
	if bytes <= 0 {
		a.maxExcl = ^uint64(0) // no limit
	}
	if err := ioctl(fd, iocQgroupLimit, unsafe.Pointer(&a)); err != nil {
		return wrap("limit qgroup", path, err)
	}
	return nil
}
