package btrfs

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"

	"github.com/forkbox/forkbox/errdefs"
)

// hasBtrfs reports whether the image holds a btrfs superblock (magic
// "_BHRfS_M" at 64 KiB + 64).
func hasBtrfs(image string) (bool, error) {
	f, err := os.Open(image)
	if err != nil {
		return false, err
	}
	defer f.Close()
	buf := make([]byte, 8)
	if _, err := f.ReadAt(buf, 0x10040); err != nil {
		return false, nil // too short: no filesystem
	}
	return bytes.Equal(buf, []byte("_BHRfS_M")), nil
}

// mkfs formats dev; with keep, without discarding its blocks first (which
// would punch holes in a preallocated image).
func mkfs(ctx context.Context, dev string, keep bool) error {
	args := []string{"-f", "-q"}
	if keep {
		args = append(args, "-K")
	}
	out, err := exec.CommandContext(ctx, "mkfs.btrfs", append(args, dev)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("mkfs.btrfs %s: %v: %s: %w", dev, err, bytes.TrimSpace(out), errdefs.ErrInternal)
	}
	return nil
}
