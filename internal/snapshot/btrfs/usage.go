package btrfs

import (
	"context"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/errdefs"
)

// What an active snapshot holds of its own, as its disk limit counts it:
// the exclusive bytes of its level-0 qgroup, which the kernel shows in
// sysfs (/sys/fs/btrfs/<fsid>/qgroups/0_<subvolume id>/exclusive) once
// quotas are on. The number moves when btrfs commits a transaction (a
// sync, or every 30 s), not at each write.

const (
	iocFSInfo    = 0x8400941f // _IOR(0x94, 31, struct btrfs_ioctl_fs_info_args)
	iocInoLookup = 0xd0009412 // _IOWR(0x94, 18, struct btrfs_ioctl_ino_lookup_args)
)

// fsInfoArgs is struct btrfs_ioctl_fs_info_args (1024 bytes); only the
// fsid is read.
type fsInfoArgs struct {
	maxID      uint64
	numDevices uint64
	fsid       [16]byte
	rest       [1024 - 32]byte
}

// inoLookupArgs is struct btrfs_ioctl_ino_lookup_args.
type inoLookupArgs struct {
	treeid   uint64
	objectid uint64
	name     [4080]byte
}

var (
	_ [1024 - unsafe.Sizeof(fsInfoArgs{})]byte
	_ [4096 - unsafe.Sizeof(inoLookupArgs{})]byte
)

// sysfsRoot is where the kernel shows btrfs filesystems.
var sysfsRoot = "/sys/fs/btrfs"

// Charged implements storage.Charger: the exclusive bytes of subvolume
// dir's qgroup. ok is false when quotas are off on the filesystem (no
// qgroup to read), and the caller measures another way.
func (b *backend) Charged(ctx context.Context, dir string) (int64, bool, error) {
	if err := ctx.Err(); err != nil {
		return 0, false, err
	}
	fd, err := openDir(dir)
	if err != nil {
		return 0, false, wrap("open", dir, err)
	}
	defer unix.Close(fd)
	var fi fsInfoArgs
	if err := ioctl(fd, iocFSInfo, unsafe.Pointer(&fi)); err != nil {
		return 0, false, wrap("fs info", dir, err)
	}
	// treeid 0 and the subvolume root's inode: the kernel answers with the
	// id of the subvolume the fd is in.
	look := inoLookupArgs{objectid: firstFreeObjID}
	if err := ioctl(fd, iocInoLookup, unsafe.Pointer(&look)); err != nil {
		return 0, false, wrap("subvolume id", dir, err)
	}
	u := hex.EncodeToString(fi.fsid[:])
	uuid := u[0:8] + "-" + u[8:12] + "-" + u[12:16] + "-" + u[16:20] + "-" + u[20:]
	qdir := filepath.Join(sysfsRoot, uuid, "qgroups")
	if _, err := os.Stat(qdir); err != nil {
		return 0, false, nil // quotas off
	}
	file := filepath.Join(qdir, fmt.Sprintf("0_%d", look.treeid), "exclusive")
	bs, err := os.ReadFile(file)
	if err != nil {
		// A subvolume made before quotas were enabled may have no qgroup
		// under simple quotas.
		return 0, false, nil
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(bs)), 10, 64)
	if err != nil {
		return 0, false, fmt.Errorf("qgroup usage %s: %q: %w", file, bs, errdefs.ErrInternal)
	}
	return n, true, nil
}
