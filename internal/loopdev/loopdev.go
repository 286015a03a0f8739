// Package loopdev attaches image files to loop devices and finds and frees
// them: the block devices behind forkbox's loop-backed filesystems (the
// btrfs snapshot pool, the encrypted memory image vault).
package loopdev

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/mount"
)

// Attach binds image to a free loop device with LO_FLAGS_AUTOCLEAR, so
// the device frees itself when its last user (the mount) goes away. It
// returns the device path and an open fd that keeps the device alive until
// the caller has mounted it.
func Attach(ctx context.Context, image string) (string, *os.File, error) {
	img, err := os.OpenFile(image, os.O_RDWR, 0)
	if err != nil {
		return "", nil, fmt.Errorf("open image: %v: %w", err, errdefs.ErrInternal)
	}
	defer img.Close()
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR, 0)
	if err != nil {
		return "", nil, fmt.Errorf("open /dev/loop-control: %v: %w", err, errdefs.ErrUnavailable)
	}
	defer ctl.Close()
	for try := 0; try < 16; try++ {
		if err := ctx.Err(); err != nil {
			return "", nil, err
		}
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return "", nil, fmt.Errorf("LOOP_CTL_GET_FREE: %v: %w", err, errdefs.ErrResourceExhausted)
		}
		dev := fmt.Sprintf("/dev/loop%d", n)
		if _, err := os.Stat(dev); errors.Is(err, os.ErrNotExist) {
			// Containers may lack device nodes for new loop devices.
			if err := unix.Mknod(dev, unix.S_IFBLK|0o660, int(unix.Mkdev(7, uint32(n)))); err != nil && !errors.Is(err, unix.EEXIST) {
				return "", nil, fmt.Errorf("mknod %s: %v: %w", dev, err, errdefs.ErrInternal)
			}
		}
		f, err := os.OpenFile(dev, os.O_RDWR, 0)
		if err != nil {
			return "", nil, fmt.Errorf("open %s: %v: %w", dev, err, errdefs.ErrInternal)
		}
		cfg := unix.LoopConfig{Fd: uint32(img.Fd())}
		cfg.Info.Flags = unix.LO_FLAGS_AUTOCLEAR
		copy(cfg.Info.File_name[:], image)
		err = unix.IoctlLoopConfigure(int(f.Fd()), &cfg)
		if err == nil {
			return dev, f, nil
		}
		f.Close()
		if !errors.Is(err, unix.EBUSY) {
			return "", nil, fmt.Errorf("LOOP_CONFIGURE %s: %v: %w", dev, err, errdefs.ErrInternal)
		}
		// Someone else took it between GET_FREE and CONFIGURE; retry.
	}
	return "", nil, fmt.Errorf("no free loop device: %w", errdefs.ErrResourceExhausted)
}

// For returns the loop devices whose backing file is image.
func For(image string) []string {
	abs, _ := filepath.Abs(image)
	matches, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	var out []string
	for _, m := range matches {
		b, err := os.ReadFile(m)
		if err != nil {
			continue
		}
		bf := strings.TrimSuffix(strings.TrimSpace(string(b)), " (deleted)")
		if bf == abs {
			out = append(out, "/dev/"+filepath.Base(filepath.Dir(filepath.Dir(m))))
		}
	}
	return out
}

// Clear detaches a loop device (LOOP_CLR_FD).
func Clear(dev string) error {
	f, err := os.OpenFile(dev, os.O_RDONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.IoctlSetInt(int(f.Fd()), unix.LOOP_CLR_FD, 0); err != nil && !errors.Is(err, unix.ENXIO) {
		return err
	}
	return nil
}

// CreateImage makes image, a new file of size bytes (0600): sparse, or
// with prealloc its blocks allocated first where the host filesystem can
// (it stays sparse where it cannot; warn is told). It returns
// created false, and nothing else, when image exists already. A failed
// CreateImage leaves no file.
func CreateImage(image string, size int64, prealloc bool, warn func(string)) (created bool, err error) {
	if _, err := os.Stat(image); err == nil {
		return false, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return false, fmt.Errorf("stat %s: %v: %w", image, err, errdefs.ErrInternal)
	}
	f, err := os.OpenFile(image, os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o600)
	if err != nil {
		return false, fmt.Errorf("create %s: %v: %w", image, err, errdefs.ErrInternal)
	}
	if prealloc {
		err = unix.Fallocate(int(f.Fd()), 0, 0, size)
		if errors.Is(err, unix.EOPNOTSUPP) {
			warn("the host filesystem cannot preallocate " + image + "; it stays sparse")
			err = nil
		}
	}
	if err == nil {
		err = f.Truncate(size)
	}
	f.Close()
	if err != nil {
		os.Remove(image)
		return false, fmt.Errorf("size %s to %d bytes (is the host filesystem big enough?): %v: %w", image, size, err, errdefs.ErrResourceExhausted)
	}
	return true, nil
}

// releaseWait bounds Release's wait for the loop device to be released
// when its context has no deadline of its own.
const releaseWait = 2 * time.Minute

// Release unmounts everything at and below mountpoint and frees the loop
// devices of image (the file stays). Idempotent; an image that does not
// exist is nothing to release.
//
// The release is asynchronous: after the unmount (a lazy one when the
// mount was busy) the kernel lets go of the device, and autoclear detaches
// it, only once the last reference to the filesystem is gone, which on a
// loaded host takes as long as it takes. Release waits for that condition,
// asking for LOOP_CLR_FD at each look, until ctx ends (releaseWait when
// ctx has no deadline).
func Release(ctx context.Context, mountpoint, image string) error {
	if _, err := os.Stat(image); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err := mount.UnmountAll(ctx, mountpoint); err != nil {
		return err
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, releaseWait)
		defer cancel()
	}
	for {
		devs := For(image)
		if len(devs) == 0 {
			return nil
		}
		for _, d := range devs {
			_ = Clear(d)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("loop devices %v still attached to %s: %w", devs, image, errors.Join(ctx.Err(), errdefs.ErrFailedPrecondition))
		case <-time.After(20 * time.Millisecond): // poll interval
		}
	}
}
