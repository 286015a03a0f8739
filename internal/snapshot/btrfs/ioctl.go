package btrfs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/errdefs"
)

// btrfs ioctls, from linux/btrfs.h (magic 0x94). x/sys/unix does not carry
// them.
const (
	iocSubvolCreate   = 0x5000940e // _IOW(0x94, 14, struct btrfs_ioctl_vol_args)
	iocSnapDestroy    = 0x5000940f // _IOW(0x94, 15, struct btrfs_ioctl_vol_args)
	iocSnapCreateV2   = 0x50009417 // _IOW(0x94, 23, struct btrfs_ioctl_vol_args_v2)
	iocSubvolGetflags = 0x80089419 // _IOR(0x94, 25, __u64)
	iocSubvolSetflags = 0x4008941a // _IOW(0x94, 26, __u64)

	subvolRdonly = 1 << 1 // BTRFS_SUBVOL_RDONLY

	superMagic     = 0x9123683e // BTRFS_SUPER_MAGIC
	firstFreeObjID = 256        // inode number of every subvolume's root dir
	volNameMax     = 4087
	subvolNameMax  = 4039
	volArgsSize    = 4096
	volArgsV2Size  = 4096
)

// volArgs is struct btrfs_ioctl_vol_args.
type volArgs struct {
	fd   int64
	name [volNameMax + 1]byte
}

// volArgsV2 is struct btrfs_ioctl_vol_args_v2.
type volArgsV2 struct {
	fd      int64
	transid uint64
	flags   uint64
	unused  [4]uint64
	name    [subvolNameMax + 1]byte
}

var (
	_ [volArgsSize - unsafe.Sizeof(volArgs{})]byte
	_ [unsafe.Sizeof(volArgs{}) - volArgsSize]byte
	_ [volArgsV2Size - unsafe.Sizeof(volArgsV2{})]byte
	_ [unsafe.Sizeof(volArgsV2{}) - volArgsV2Size]byte
)

func ioctl(fd int, req uintptr, arg unsafe.Pointer) error {
	_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, uintptr(arg))
	if e != 0 {
		return e
	}
	return nil
}

func openDir(path string) (int, error) {
	return unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
}

// wrap gives an errno from a btrfs ioctl an errdefs class.
func wrap(op, path string, err error) error {
	class := errdefs.ErrInternal
	switch {
	case errors.Is(err, unix.EEXIST):
		class = errdefs.ErrAlreadyExists
	case errors.Is(err, unix.ENOENT):
		class = errdefs.ErrNotFound
	case errors.Is(err, unix.ENOSPC), errors.Is(err, unix.EDQUOT):
		class = errdefs.ErrResourceExhausted
	case errors.Is(err, unix.ENOTTY), errors.Is(err, unix.EXDEV), errors.Is(err, unix.EOPNOTSUPP):
		class = errdefs.ErrFailedPrecondition
	case errors.Is(err, unix.EBUSY), errors.Is(err, unix.ENOTEMPTY):
		class = errdefs.ErrFailedPrecondition
	}
	return fmt.Errorf("btrfs %s %s: %v: %w", op, path, err, class)
}

// createSubvolume creates an empty subvolume at path.
func createSubvolume(path string) error {
	return volIoctl(path, iocSubvolCreate, "create subvolume")
}

// volIoctl runs a subvolume ioctl that names path's last element, on its
// parent directory.
func volIoctl(path string, req uintptr, op string) error {
	dir, name := filepath.Split(filepath.Clean(path))
	if len(name) > volNameMax {
		return fmt.Errorf("subvolume name %q too long: %w", name, errdefs.ErrInvalidArgument)
	}
	fd, err := openDir(dir)
	if err != nil {
		return wrap("open", dir, err)
	}
	defer unix.Close(fd)
	var a volArgs
	copy(a.name[:], name)
	if err := ioctl(fd, req, unsafe.Pointer(&a)); err != nil {
		return wrap(op, path, err)
	}
	return nil
}

// snapshotSubvolume makes dst a snapshot of subvolume src; read-only if
// readonly.
func snapshotSubvolume(src, dst string, readonly bool) error {
	dir, name := filepath.Split(filepath.Clean(dst))
	if len(name) > subvolNameMax {
		return fmt.Errorf("snapshot name %q too long: %w", name, errdefs.ErrInvalidArgument)
	}
	sfd, err := openDir(src)
	if err != nil {
		return wrap("open", src, err)
	}
	defer unix.Close(sfd)
	dfd, err := openDir(dir)
	if err != nil {
		return wrap("open", dir, err)
	}
	defer unix.Close(dfd)
	a := volArgsV2{fd: int64(sfd)}
	if readonly {
		a.flags = subvolRdonly
	}
	copy(a.name[:], name)
	if err := ioctl(dfd, iocSnapCreateV2, unsafe.Pointer(&a)); err != nil {
		return wrap("snapshot", src+" -> "+dst, err)
	}
	return nil
}

// setReadonly sets or clears the read-only flag of subvolume path.
func setReadonly(path string, ro bool) error {
	fd, err := openDir(path)
	if err != nil {
		return wrap("open", path, err)
	}
	defer unix.Close(fd)
	var flags uint64
	if err := ioctl(fd, iocSubvolGetflags, unsafe.Pointer(&flags)); err != nil {
		return wrap("get flags", path, err)
	}
	nf := flags &^ subvolRdonly
	if ro {
		nf |= subvolRdonly
	}
	if nf == flags {
		return nil
	}
	if err := ioctl(fd, iocSubvolSetflags, unsafe.Pointer(&nf)); err != nil {
		return wrap("set flags", path, err)
	}
	return nil
}

// isSubvolume reports whether path is the root of a btrfs subvolume.
func isSubvolume(path string) (bool, error) {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return false, err
	}
	if st.Ino != firstFreeObjID || st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return false, nil
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(path, &fs); err != nil {
		return false, err
	}
	return uint32(fs.Type) == superMagic, nil
}

// deleteSubvolume destroys subvolume path, read-only or not. It must not
// contain nested subvolumes (the store never nests them).
func deleteSubvolume(path string) error {
	if err := setReadonly(path, false); err != nil {
		return err
	}
	return volIoctl(path, iocSnapDestroy, "delete subvolume")
}

// removePath deletes path whether it is a subvolume or a plain directory
// tree. Missing paths are fine.
func removePath(path string) error {
	sub, err := isSubvolume(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return wrap("stat", path, err)
	}
	if sub {
		return deleteSubvolume(path)
	}
	if err := os.RemoveAll(path); err != nil {
		return fmt.Errorf("remove %s: %v: %w", path, err, errdefs.ErrInternal)
	}
	return nil
}
