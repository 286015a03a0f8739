package mount

import (
	"errors"
	"fmt"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/errdefs"
)

// mountOverlay mounts an overlay. When the option string fits in a page it
// uses mount(2); otherwise it uses the fsopen/fsconfig API (Linux 6.8+ for
// "lowerdir+"), passing one lower directory per call, which has no length
// limit. Lowerdirs in "lowerdir=" are topmost first, as for mount(8).
func mountOverlay(source, target string, flags uintptr, data []string) error {
	joined := strings.Join(data, ",")
	if len(joined) < pageSize {
		return mountData(source, target, "overlay", flags, joined)
	}
	err := fsmountOverlay(source, target, flags, data)
	if errors.Is(err, unix.ENOSYS) {
		return fmt.Errorf("overlay on %s: option string is %d bytes, over the %d-byte page limit, and the kernel lacks fsopen: %w",
			target, len(joined), pageSize, errdefs.ErrInvalidArgument)
	}
	return err
}

func fsmountOverlay(source, target string, flags uintptr, data []string) error {
	fsfd, err := unix.Fsopen("overlay", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return fmt.Errorf("fsopen overlay: %w", err)
	}
	defer unix.Close(fsfd)
	if source == "" {
		source = "overlay"
	}
	if err := unix.FsconfigSetString(fsfd, "source", source); err != nil {
		return fmt.Errorf("overlay fsconfig source: %w", classify(err))
	}
	for _, o := range data {
		key, val, hasVal := strings.Cut(o, "=")
		if key == "lowerdir" {
			for _, l := range strings.Split(val, ":") {
				if err := unix.FsconfigSetString(fsfd, "lowerdir+", l); err != nil {
					return fmt.Errorf("overlay on %s: lowerdir+ %s: %w", target, l, classify(err))
				}
			}
			continue
		}
		if !hasVal {
			err = unix.FsconfigSetFlag(fsfd, key)
		} else {
			err = unix.FsconfigSetString(fsfd, key, val)
		}
		if err != nil {
			return fmt.Errorf("overlay on %s: option %s: %w", target, o, classify(err))
		}
	}
	if err := unix.FsconfigCreate(fsfd); err != nil {
		return fmt.Errorf("overlay on %s: create: %w", target, classify(err))
	}
	var attrs int
	for f, a := range map[uintptr]int{
		unix.MS_RDONLY: unix.MOUNT_ATTR_RDONLY, unix.MS_NOSUID: unix.MOUNT_ATTR_NOSUID,
		unix.MS_NODEV: unix.MOUNT_ATTR_NODEV, unix.MS_NOEXEC: unix.MOUNT_ATTR_NOEXEC,
		unix.MS_NOATIME: unix.MOUNT_ATTR_NOATIME,
	} {
		if flags&f != 0 {
			attrs |= a
		}
	}
	mfd, err := unix.Fsmount(fsfd, unix.FSMOUNT_CLOEXEC, attrs)
	if err != nil {
		return fmt.Errorf("overlay on %s: fsmount: %w", target, classify(err))
	}
	defer unix.Close(mfd)
	if err := unix.MoveMount(mfd, "", unix.AT_FDCWD, target, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("overlay on %s: move_mount: %w", target, classify(err))
	}
	return nil
}
