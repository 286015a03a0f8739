package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/mount"
	"github.com/forkbox/forkbox/internal/store"
)

// A hibernated sandbox's root filesystem is unmounted ("parked"). Every
// mount of the host is copied into each new mount namespace, and every
// gVisor start, restore and wake makes two (its gofer's and its sandbox's)
// and reads the host's mount table for its cgroups: a rootfs kept mounted
// for each of 10,000 hibernated sessions made all of them slower. A
// parked rootfs's mounts are kept in its bundle (parkedFile); wake mounts
// them again, and the image store's layer collection counts their layers
// as in use (the sandbox's image may be replaced or removed meanwhile).
//
// The file is written before the unmount and removed after the mount, so a
// crash anywhere leaves a rootfs that is mounted, or parked with its
// mounts on record: wake handles both, and a sandbox hibernated by an
// older daemon (no file) is mounted.

const parkedFile = "rootfs.parked.json"

// maxParkedFile bounds what wake reads back (a few layer paths).
const maxParkedFile = 1 << 20

func (d *Daemon) parkedPath(id string) string { return filepath.Join(d.bundleDir(id), parkedFile) }

// parkRootfs unmounts the rootfs of hibernated sandbox sb after recording
// its mounts. A failure leaves it mounted, as before parking existed: it
// is logged and costs only the mount.
func (d *Daemon) parkRootfs(ctx context.Context, sb *store.Sandbox) {
	err := d.park(ctx, sb)
	d.bestEffort(ctx, "unmount the root filesystem of a hibernated sandbox", err, slog.String("sandbox", sb.ID))
}

func (d *Daemon) park(ctx context.Context, sb *store.Sandbox) error {
	img, err := d.images.Get(ctx, sb.ImageDigest)
	if err != nil {
		return fmt.Errorf("its image: %w", err)
	}
	mounts, err := d.snaps.Mounts(ctx, sb.ID, img.Layers)
	if err != nil {
		return err
	}
	b, err := json.Marshal(mounts)
	if err != nil {
		return err
	}
	// A crash of the daemon keeps what it wrote; one of the host takes
	// every mount with it.
	if err := os.WriteFile(d.parkedPath(sb.ID), b, 0o600); err != nil {
		return err
	}
	return d.unmountRootfs(ctx, sb.ID)
}

// unparkRootfs mounts the rootfs of sandbox id again if it was parked.
func (d *Daemon) unparkRootfs(ctx context.Context, id string) error {
	mounts, err := d.parked(id)
	if err != nil || mounts == nil {
		return err
	}
	rootfs := d.rootfsDir(id)
	mounted, err := mount.IsMountPoint(rootfs)
	if err != nil {
		return err
	}
	if !mounted { // else a crash came between the record and the unmount
		if err := d.host.MountAll(ctx, mounts, rootfs); err != nil {
			return fmt.Errorf("mount rootfs: %w", err)
		}
	}
	return os.Remove(d.parkedPath(id))
}

// parked returns the recorded mounts of sandbox id's parked rootfs (nil
// when it is not parked).
func (d *Daemon) parked(id string) ([]mount.Mount, error) {
	f, err := os.Open(d.parkedPath(id))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var mounts []mount.Mount
	dec := json.NewDecoder(io.LimitReader(f, maxParkedFile))
	if err := dec.Decode(&mounts); err != nil {
		return nil, fmt.Errorf("%s: %v: %w", d.parkedPath(id), err, errdefs.ErrInternal)
	}
	if len(mounts) == 0 {
		return nil, fmt.Errorf("%s records no mount: %w", d.parkedPath(id), errdefs.ErrInternal)
	}
	return mounts, nil
}

// parkedLayers adds to inUse the overlay lowers of every parked rootfs.
func (d *Daemon) parkedLayers(inUse map[string]bool) {
	files, _ := filepath.Glob(filepath.Join(d.bundlesDir(), "*", parkedFile))
	for _, f := range files {
		mounts, err := d.parked(filepath.Base(filepath.Dir(f)))
		if err != nil {
			d.log.Warn("cannot read a parked rootfs's mounts to protect its layers", "err", err)
			continue
		}
		for _, m := range mounts {
			for _, l := range overlayLowers(m.Options) {
				inUse[l] = true
			}
		}
	}
}
