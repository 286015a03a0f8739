package btrfs

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"path/filepath"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/errdefs"
)

// iocGetSubvolInfo is BTRFS_IOC_GET_SUBVOL_INFO:
// _IOR(0x94, 60, struct btrfs_ioctl_get_subvol_info_args), 504 bytes.
const (
	iocGetSubvolInfo = 0x81f8943c
	subvolInfoSize   = 504
	// Offsets in struct btrfs_ioctl_get_subvol_info_args.
	offFlags        = 288
	offUUID         = 296
	offParentUUID   = 312
	offReceivedUUID = 328
	// rootSubvolRdonly is BTRFS_ROOT_SUBVOL_RDONLY, the root item's flag
	// (not the ioctl's BTRFS_SUBVOL_RDONLY).
	rootSubvolRdonly = 1 << 0
)

// SubvolInfo is what btrfs says of one subvolume: its identity across
// send and receive.
type SubvolInfo struct {
	// UUID is the subvolume's own; ParentUUID that of the subvolume it is
	// a snapshot of ("" if none); ReceivedUUID that of the subvolume on
	// the sending host it was received from ("" if it was not received).
	UUID, ParentUUID, ReceivedUUID string
	ReadOnly                       bool
}

// Origin is the UUID by which an incremental send names this subvolume
// as its parent: the received UUID of a received copy, else its own.
func (s SubvolInfo) Origin() string {
	if s.ReceivedUUID != "" {
		return s.ReceivedUUID
	}
	return s.UUID
}

// Subvolume returns the btrfs identity of the subvolume at path.
func Subvolume(path string) (SubvolInfo, error) {
	if ok, err := isSubvolume(path); err != nil {
		return SubvolInfo{}, wrap("stat", path, err)
	} else if !ok {
		return SubvolInfo{}, fmt.Errorf("%s is not a btrfs subvolume: %w", path, errdefs.ErrFailedPrecondition)
	}
	fd, err := openDir(path)
	if err != nil {
		return SubvolInfo{}, wrap("open", path, err)
	}
	defer unix.Close(fd)
	var buf [subvolInfoSize]byte
	if err := ioctl(fd, iocGetSubvolInfo, unsafe.Pointer(&buf[0])); err != nil {
		return SubvolInfo{}, wrap("get subvolume info", path, err)
	}
	return SubvolInfo{
		UUID:         uuidString(buf[offUUID : offUUID+16]),
		ParentUUID:   uuidString(buf[offParentUUID : offParentUUID+16]),
		ReceivedUUID: uuidString(buf[offReceivedUUID : offReceivedUUID+16]),
		ReadOnly:     binary.LittleEndian.Uint64(buf[offFlags:])&rootSubvolRdonly != 0,
	}, nil
}

// uuidString formats a 16-byte UUID as btrfs prints it ("" for all zeros).
func uuidString(b []byte) string {
	zero := true
	for _, c := range b {
		zero = zero && c == 0
	}
	if zero {
		return ""
	}
	h := hex.EncodeToString(b)
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}

// CommittedPath returns the subvolume of committed snapshot name (it need
// not exist).
func (s *Snapshotter) CommittedPath(name string) string {
	return filepath.Join(s.Root(), "committed", name)
}
