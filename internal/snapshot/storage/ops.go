package storage

import (
	"context"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/mount"
	"github.com/forkbox/forkbox/internal/snapshot"
)

// Prepare implements snapshot.Snapshotter.
func (s *Store) Prepare(ctx context.Context, key, parent string, opts ...snapshot.Opt) error {
	return s.retryFull(ctx, func() error { return s.prepare(ctx, key, parent, opts...) })
}

func (s *Store) prepare(ctx context.Context, key, parent string, opts ...snapshot.Opt) (retErr error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.checkFree(key); err != nil {
		return err
	}
	info, err := newInfo(key, parent, snapshot.KindActive, opts)
	if err != nil {
		return err
	}
	dst := filepath.Join(s.root, dirActive, key)
	if parent == "" {
		if err := s.backend.Create(ctx, dst); err != nil {
			return fmt.Errorf("prepare %q: %w", key, err)
		}
	} else {
		pdir, pinfo, err := s.find(parent)
		if err != nil {
			return fmt.Errorf("prepare %q: parent: %w", key, err)
		}
		if pinfo.Kind != snapshot.KindCommitted {
			return fmt.Errorf("prepare %q: parent %q is %s, not committed: %w", key, parent, pinfo.Kind, errdefs.ErrFailedPrecondition)
		}
		if err := s.backend.Clone(ctx, pdir, dst, false); err != nil {
			return fmt.Errorf("prepare %q from %q: %w", key, parent, err)
		}
	}
	defer s.undoOnError(ctx, &retErr, dst)
	if info.DiskLimit > 0 {
		if err := s.backend.Limit(ctx, dst, info.DiskLimit); err != nil {
			return fmt.Errorf("prepare %q: disk limit: %w", key, err)
		}
	}
	if err := resetWork(dst); err != nil {
		return fmt.Errorf("prepare %q: %v: %w", key, err, ioClass(err))
	}
	if err := s.writeMeta(info); err != nil {
		return fmt.Errorf("prepare %q: metadata: %v: %w", key, err, ioClass(err))
	}
	return nil
}

// undoOnError deletes a half-made data dir when *err is set.
func (s *Store) undoOnError(ctx context.Context, err *error, dir string) {
	if *err == nil {
		return
	}
	if derr := s.backend.Delete(context.WithoutCancel(ctx), dir); derr != nil {
		s.log.WarnContext(ctx, "cleanup failed; Open will sweep it", slog.String("path", dir), slog.Any("err", derr))
	}
}

// Commit implements snapshot.Snapshotter. Unlike Prepare it does not wait
// for a full pool's space to come back (retryFull): its callers hold the
// sandbox frozen or stopped around it, and a full pool must not keep a
// tenant frozen for the cleaner.
func (s *Store) Commit(ctx context.Context, name, key string, opts ...snapshot.Opt) (retErr error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.checkFree(name); err != nil {
		return err
	}
	cinfo, err := newInfo(name, "", snapshot.KindCommitted, opts)
	if err != nil {
		return err
	}
	dir, info, err := s.find(key)
	if err != nil {
		return fmt.Errorf("commit %q: %w", name, err)
	}
	if info.Kind != snapshot.KindActive {
		return fmt.Errorf("commit %q: %q is not active: %w", name, key, errdefs.ErrFailedPrecondition)
	}
	dst := filepath.Join(s.root, dirCommitted, name)
	if err := s.backend.Clone(ctx, dir, dst, true); err != nil {
		return fmt.Errorf("commit %q from %q: %w", name, key, err)
	}
	defer s.undoOnError(ctx, &retErr, dst)
	cinfo.Parent = info.Parent
	if err := s.writeMeta(cinfo); err != nil {
		return fmt.Errorf("commit %q: metadata: %v: %w", name, err, ioClass(err))
	}
	return nil
}

// Remove implements snapshot.Snapshotter.
func (s *Store) Remove(ctx context.Context, key string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	dir, _, err := s.find(key)
	if err != nil {
		return fmt.Errorf("remove: %w", err)
	}
	if where, err := mountedAt(dir); err != nil {
		return err
	} else if where != "" {
		return fmt.Errorf("remove %q: still mounted at %s: %w", key, where, errdefs.ErrFailedPrecondition)
	}
	if err := os.Remove(s.metaPath(key)); err != nil {
		return fmt.Errorf("remove %q: %v: %w", key, err, errdefs.ErrInternal)
	}
	if err := syncDir(filepath.Join(s.root, dirMeta)); err != nil {
		return fmt.Errorf("remove %q: %v: %w", key, err, errdefs.ErrInternal)
	}
	// The snapshot is gone. Free its name at once by moving the data to a
	// tombstone; failures below are only logged, Open sweeps the rest.
	tomb := s.tmpPath("rm-")
	if err := s.backend.Unseal(ctx, dir); err != nil {
		s.log.WarnContext(ctx, "unsealing removed snapshot failed", slog.String("snapshot", key), slog.Any("err", err))
	} else if err := os.Rename(dir, tomb); err != nil {
		s.log.WarnContext(ctx, "moving removed snapshot to tombstone failed", slog.String("snapshot", key), slog.Any("err", err))
		tomb = dir
	}
	if err := s.backend.Delete(ctx, tomb); err != nil {
		s.log.WarnContext(ctx, "deleting removed snapshot failed", slog.String("snapshot", key), slog.Any("err", err))
	}
	return nil
}

// mountedAt returns a mount point that uses dir (an overlay whose upperdir
// or workdir is in it, or a mount below it), or "".
func mountedAt(dir string) (string, error) {
	infos, err := mount.List()
	if err != nil {
		return "", err
	}
	for _, in := range infos {
		if in.Mountpoint == dir || strings.HasPrefix(in.Mountpoint, dir+"/") {
			return in.Mountpoint, nil
		}
		if in.FSType != "overlay" {
			continue
		}
		for _, o := range strings.Split(in.SuperOptions, ",") {
			k, v, _ := strings.Cut(o, "=")
			if (k == "upperdir" || k == "workdir") && strings.HasPrefix(v, dir+"/") {
				return in.Mountpoint, nil
			}
		}
	}
	return "", nil
}

// Mounts implements snapshot.Snapshotter. lowers are base first.
func (s *Store) Mounts(ctx context.Context, key string, lowers []string) ([]mount.Mount, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	dir, info, err := s.find(key)
	if err != nil {
		return nil, fmt.Errorf("mounts: %w", err)
	}
	if info.Kind != snapshot.KindActive {
		return nil, fmt.Errorf("mounts of %q: not active: %w", key, errdefs.ErrFailedPrecondition)
	}
	upper := filepath.Join(dir, "upper")
	for _, d := range []string{upper, filepath.Join(dir, "work")} {
		// A crash may have lost the directories of a fresh snapshot.
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("mounts of %q: %v: %w", key, err, errdefs.ErrInternal)
		}
	}
	if len(lowers) == 0 {
		return []mount.Mount{{Type: "bind", Source: upper, Options: []string{"rbind", "rw"}}}, nil
	}
	top := make([]string, len(lowers))
	for i, l := range lowers {
		if !filepath.IsAbs(l) || strings.ContainsAny(l, ":,") {
			return nil, fmt.Errorf("lower dir %q: must be absolute, without ':' or ',': %w", l, errdefs.ErrInvalidArgument)
		}
		top[len(lowers)-1-i] = l
	}
	opts := []string{}
	if _, err := os.Stat("/sys/module/overlay/parameters/index"); err == nil {
		// A committed upper is mounted again by its children; the
		// inode index would tie it to the first overlay.
		opts = append(opts, "index=off")
	}
	opts = append(opts,
		"lowerdir="+strings.Join(top, ":"),
		"upperdir="+upper,
		"workdir="+filepath.Join(dir, "work"),
	)
	return []mount.Mount{{Type: "overlay", Source: "overlay", Options: opts}}, nil
}

// Charged implements snapshot.Snapshotter: the backend's count when it
// has one (a Charger), else Usage.
func (s *Store) Charged(ctx context.Context, key string) (int64, error) {
	s.mu.Lock()
	dir, _, err := s.find(key)
	s.mu.Unlock()
	if err != nil {
		return 0, fmt.Errorf("charged: %w", err)
	}
	if c, ok := s.backend.(Charger); ok {
		n, ok, err := c.Charged(ctx, dir)
		if err != nil {
			return 0, err
		}
		if ok {
			return n, nil
		}
	}
	return s.Usage(ctx, key)
}

// Usage implements snapshot.Snapshotter: the disk blocks used by the files
// of the snapshot's upper layer, each inode counted once.
func (s *Store) Usage(ctx context.Context, key string) (int64, error) {
	s.mu.Lock()
	dir, _, err := s.find(key)
	s.mu.Unlock()
	if err != nil {
		return 0, fmt.Errorf("usage: %w", err)
	}
	type ino struct{ dev, ino uint64 }
	seen := make(map[ino]struct{})
	var total int64
	err = filepath.WalkDir(filepath.Join(dir, "upper"), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return nil
		}
		k := ino{uint64(st.Dev), st.Ino}
		if _, dup := seen[k]; dup {
			return nil
		}
		seen[k] = struct{}{}
		total += st.Blocks * 512
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("usage of %q: %v: %w", key, err, errdefs.ErrInternal)
	}
	return total, nil
}
