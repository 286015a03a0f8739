package daemon

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/image"
	"github.com/forkbox/forkbox/internal/mount"
)

// PullImage pulls an image from a registry.
func (d *Daemon) PullImage(ctx context.Context, ref string, insecure bool, progress func(image.Progress)) (image.Image, error) {
	return d.images.Pull(ctx, ref, insecure, progress)
}

// ImportImage imports an image archive on the daemon's host.
func (d *Daemon) ImportImage(ctx context.Context, path, name string, progress func(image.Progress)) (image.Image, error) {
	return d.importImage(ctx, path, name, progress, false)
}

// ImportImageKeep is ImportImage that keeps an image the name holds
// already (image.Store.ImportKeep).
func (d *Daemon) ImportImageKeep(ctx context.Context, path, name string, progress func(image.Progress)) (image.Image, error) {
	return d.importImage(ctx, path, name, progress, true)
}

func (d *Daemon) importImage(ctx context.Context, path, name string, progress func(image.Progress), keep bool) (image.Image, error) {
	if !filepath.IsAbs(path) {
		return image.Image{}, fmt.Errorf("archive path %q must be absolute (it is read by the daemon): %w", path, errdefs.ErrInvalidArgument)
	}
	if st, err := os.Stat(path); err == nil && !st.Mode().IsRegular() {
		return image.Image{}, fmt.Errorf("archive %s is not a regular file: %w", path, errdefs.ErrInvalidArgument)
	}
	if keep {
		return d.images.ImportKeep(ctx, path, name, progress)
	}
	return d.images.Import(ctx, path, name, progress)
}

// RemoveImage removes an image that no live sandbox uses.
func (d *Daemon) RemoveImage(ctx context.Context, name string) error {
	img, err := d.images.Get(ctx, name)
	if err != nil {
		return err
	}
	live, err := d.store.ListSandboxes(ctx, false)
	if err != nil {
		return err
	}
	for _, sb := range live {
		if sb.ImageDigest == img.Digest && sb.Image == img.Name {
			return fmt.Errorf("image %s is used by sandbox %s: %w", img.Name, sb.ID, errdefs.ErrFailedPrecondition)
		}
	}
	return d.images.Remove(ctx, name)
}

// layersInUse returns the image layer directories that sandbox root
// filesystems use as overlay lowers: the mounted ones read from the mount
// table, so that it holds whatever the store records say, and the parked
// ones (hibernated) from their records.
func (d *Daemon) layersInUse() map[string]bool {
	inUse := map[string]bool{}
	infos, err := mount.List()
	if err != nil {
		d.log.Warn("cannot read the mount table to protect layers in use", "err", err)
		return nil
	}
	for _, in := range infos {
		if in.FSType != "overlay" || !strings.HasPrefix(in.Mountpoint, d.bundlesDir()+"/") {
			continue
		}
		for _, l := range overlayLowers(strings.Split(in.SuperOptions, ",")) {
			inUse[l] = true
		}
	}
	d.parkedLayers(inUse) // hibernated sandboxes' rootfs, unmounted (park.go)
	return inUse
}

// overlayLowers returns the lower directories named by overlay options
// ("lowerdir=a:b" or one "lowerdir+=a" each).
func overlayLowers(opts []string) []string {
	var lowers []string
	for _, opt := range opts {
		if v, ok := strings.CutPrefix(opt, "lowerdir="); ok {
			lowers = append(lowers, strings.Split(v, ":")...)
		}
		if v, ok := strings.CutPrefix(opt, "lowerdir+="); ok {
			lowers = append(lowers, v)
		}
	}
	return lowers
}
