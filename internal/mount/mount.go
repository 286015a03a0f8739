package mount

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/errdefs"
)

// Mount is one filesystem mount, described as data: the same shape as
// containerd's mount.Mount.
type Mount struct {
	// Type is the filesystem type: "overlay", "bind", "btrfs", ...
	Type string
	// Source is the device or directory; "overlay" for overlays.
	Source string
	// Options are mount options, as for mount(8) -o: flags such as "ro",
	// "rbind", "nodev" and filesystem data such as "lowerdir=...".
	Options []string
}

// flag options understood by mount(8), mapped to MS_* flags. clear is true
// for options that clear a flag.
var flagOptions = map[string]struct {
	clear bool
	flag  uintptr
}{
	"ro":          {false, unix.MS_RDONLY},
	"rw":          {true, unix.MS_RDONLY},
	"nosuid":      {false, unix.MS_NOSUID},
	"suid":        {true, unix.MS_NOSUID},
	"nodev":       {false, unix.MS_NODEV},
	"dev":         {true, unix.MS_NODEV},
	"noexec":      {false, unix.MS_NOEXEC},
	"exec":        {true, unix.MS_NOEXEC},
	"noatime":     {false, unix.MS_NOATIME},
	"relatime":    {false, unix.MS_RELATIME},
	"strictatime": {false, unix.MS_STRICTATIME},
	"bind":        {false, unix.MS_BIND},
	"rbind":       {false, unix.MS_BIND | unix.MS_REC},
	"private":     {false, unix.MS_PRIVATE},
	"rprivate":    {false, unix.MS_PRIVATE | unix.MS_REC},
}

// parseOptions splits options into MS_* flags and the filesystem data string.
func parseOptions(options []string) (flags uintptr, data []string) {
	for _, o := range options {
		if f, ok := flagOptions[o]; ok {
			if f.clear {
				flags &^= f.flag
			} else {
				flags |= f.flag
			}
			continue
		}
		data = append(data, o)
	}
	return flags, data
}

// All mounts mounts on target in order, each on top of the previous one. On
// failure the mounts already made are undone. target must exist.
func All(ctx context.Context, mounts []Mount, target string) error {
	for i, m := range mounts {
		if err := ctx.Err(); err != nil {
			unmountN(ctx, target, i)
			return err
		}
		if err := m.mount(target); err != nil {
			unmountN(ctx, target, i)
			return err
		}
	}
	return nil
}

func unmountN(ctx context.Context, target string, n int) {
	for ; n > 0; n-- {
		_ = Unmount(ctx, target)
	}
}

func (m Mount) mount(target string) error {
	if m.Type == "" && m.Source == "" {
		return fmt.Errorf("mount on %s: empty mount: %w", target, errdefs.ErrInvalidArgument)
	}
	flags, data := parseOptions(m.Options)
	typ := m.Type
	if typ == "bind" || typ == "rbind" {
		typ = ""
		flags |= unix.MS_BIND
		if m.Type == "rbind" {
			flags |= unix.MS_REC
		}
	}
	if m.Type == "overlay" {
		return mountOverlay(m.Source, target, flags, data)
	}
	return mountData(m.Source, target, typ, flags, strings.Join(data, ","))
}

// mountData calls mount(2); a read-only bind needs a second remount call.
func mountData(source, target, typ string, flags uintptr, data string) error {
	const propagation = unix.MS_SHARED | unix.MS_PRIVATE | unix.MS_SLAVE | unix.MS_UNBINDABLE
	if err := unix.Mount(source, target, typ, flags&^propagation, data); err != nil {
		return fmt.Errorf("mount %s %s on %s (%s): %w", typ, source, target, data, classify(err))
	}
	if flags&unix.MS_BIND != 0 && flags&unix.MS_RDONLY != 0 {
		rf := unix.MS_BIND | unix.MS_REMOUNT | unix.MS_RDONLY | (flags & (unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC))
		if err := unix.Mount("", target, "", rf, ""); err != nil {
			_ = unix.Unmount(target, unix.MNT_DETACH)
			return fmt.Errorf("remount %s read-only: %w", target, classify(err))
		}
	}
	if p := flags & propagation; p != 0 {
		if err := unix.Mount("", target, "", p|(flags&unix.MS_REC), ""); err != nil {
			_ = unix.Unmount(target, unix.MNT_DETACH)
			return fmt.Errorf("set propagation of %s: %w", target, classify(err))
		}
	}
	return nil
}

// Bind bind-mounts src on target, read-only when readonly is set.
func Bind(ctx context.Context, src, target string, readonly bool) error {
	opts := []string{"rbind"}
	if readonly {
		opts = append(opts, "ro")
	}
	return All(ctx, []Mount{{Type: "bind", Source: src, Options: opts}}, target)
}

// Remount changes the flags of the mount on target to options (mount(8)
// -o flags such as "ro", "nosuid", "nodev"; filesystem data is passed on as
// the remount's data). It is how a file system filled by its owner is
// sealed read-only.
func Remount(ctx context.Context, target string, options []string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	flags, data := parseOptions(options)
	if err := unix.Mount("", target, "", unix.MS_REMOUNT|flags, strings.Join(data, ",")); err != nil {
		return fmt.Errorf("remount %s (%s): %w", target, strings.Join(options, ","), classify(err))
	}
	return nil
}

// Unmount unmounts the topmost mount on target. If target is busy it is
// detached lazily. Unmounting something that is not mounted (or does not
// exist) returns nil.
func Unmount(ctx context.Context, target string) error {
	for i := 0; ; i++ {
		err := unix.Unmount(target, 0)
		switch {
		case err == nil:
			return nil
		case errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOENT):
			return nil // not a mount point, or gone
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.EBUSY) && i < 3 && ctx.Err() == nil:
			continue
		case errors.Is(err, unix.EBUSY):
			if err := unix.Unmount(target, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
				return fmt.Errorf("detach %s: %w", target, classify(err))
			}
			return nil
		default:
			return fmt.Errorf("unmount %s: %w", target, classify(err))
		}
	}
}

// UnmountAll unmounts every mount stacked on target and every mount below it,
// deepest first. It is idempotent.
func UnmountAll(ctx context.Context, target string) error {
	points, err := Under(target)
	if err != nil {
		return err
	}
	var errs []error
	for _, p := range points {
		if err := Unmount(ctx, p); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// classify wraps a mount syscall errno in an errdefs class.
func classify(err error) error {
	switch {
	case errors.Is(err, unix.ENOENT), errors.Is(err, unix.ENOTDIR):
		return fmt.Errorf("%w: %w", err, errdefs.ErrNotFound)
	case errors.Is(err, unix.EPERM), errors.Is(err, unix.EACCES):
		return fmt.Errorf("%w: %w", err, errdefs.ErrPermissionDenied)
	case errors.Is(err, unix.EBUSY):
		return fmt.Errorf("%w: %w", err, errdefs.ErrFailedPrecondition)
	case errors.Is(err, unix.ENODEV):
		return fmt.Errorf("%w (filesystem not supported by the kernel): %w", err, errdefs.ErrUnavailable)
	case errors.Is(err, unix.ENOMEM), errors.Is(err, unix.ENOSPC):
		return fmt.Errorf("%w: %w", err, errdefs.ErrResourceExhausted)
	case errors.Is(err, unix.EINVAL):
		return fmt.Errorf("%w: %w", err, errdefs.ErrInvalidArgument)
	}
	return fmt.Errorf("%w: %w", err, errdefs.ErrInternal)
}

var pageSize = os.Getpagesize()

// Restrict makes dir a mount point of its own (a bind mount of dir on
// itself when it is not one already) and sets that mount's flags to nosuid,
// nodev and noatime, keeping it writable. Setuid bits and device nodes that
// a sandbox or an image puts below dir then grant nothing to anyone who
// reaches them through the host's view of dir. Mounts made on paths below
// dir (a sandbox's rootfs overlay, whose upper directory lives there) are
// separate mounts and keep their own flags. Restrict is idempotent.
func Restrict(ctx context.Context, dir string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	mp, err := IsMountPoint(dir)
	if err != nil {
		return err
	}
	if !mp {
		if err := unix.Mount(dir, dir, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind %s on itself: %w", dir, classify(err))
		}
	}
	const flags = unix.MS_REMOUNT | unix.MS_BIND | unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOATIME
	if err := unix.Mount("", dir, "", flags, ""); err != nil {
		if !mp {
			_ = unix.Unmount(dir, unix.MNT_DETACH)
		}
		return fmt.Errorf("remount %s nosuid,nodev: %w", dir, classify(err))
	}
	return nil
}
