package daemon

import (
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/snapshot"
	"github.com/forkbox/forkbox/internal/store"
)

// Disk limits. A sandbox's writes land in its writable layer, an active
// snapshot; the snapshotter limits what that layer may hold of its own
// (snapshot.WithDiskLimit: btrfs simple quotas, EDQUOT inside the sandbox
// past the limit). The limit counts only what the sandbox writes itself: a
// fork is not charged for the data it shares with its checkpoint, and a
// fork is still one O(1) snapshot.
//
//   - A sandbox asks for a limit with resources.disk ("2Gi"; "0" = none).
//     Its config keeps what it asked for (DiskStr, DiskBytes); forks,
//     restores and resumes inherit it with the rest of the config, and an
//     override replaces it.
//   - A sandbox that asked for nothing gets the daemon's default
//     (Config.DefaultDisk, `forkbox serve --default-disk`), read when its
//     layer is prepared, so a tenant who asked for nothing still cannot
//     fill the pool.
//   - The copy snapshotter cannot enforce a limit. An explicit one is a
//     FailedPrecondition (checkDisk, before anything is made; and Prepare
//     refuses it again); the daemon's default is not applied there and
//     New logs that once (warnDiskDefault).
//
// Everything else a sandbox could grow on the host is bounded elsewhere:
// its identity files are read-only binds (bundle.go), the pool is mounted
// nosuid,nodev. A full pool or state filesystem fails create, fork and
// checkpoint with ResourceExhausted (diskFull).

const (
	// DefaultDisk is `forkbox serve --default-disk`'s default.
	DefaultDisk = 10 << 30
	minDisk     = 16 << 20
)

var diskSuffixes = []struct {
	suffix string
	mult   int64
}{
	{"Ki", 1 << 10}, {"Mi", 1 << 20}, {"Gi", 1 << 30}, {"Ti", 1 << 40},
	{"K", 1e3}, {"M", 1e6}, {"G", 1e9}, {"T", 1e12},
}

// ParseDisk parses a disk limit: bytes, or with a suffix "500Mi", "2Gi",
// "10G". "0" is no limit. "" returns 0 as well: the caller keeps DiskStr
// "" and the daemon's default applies.
func ParseDisk(s string) (int64, error) {
	if s == "" || s == "0" {
		return 0, nil
	}
	num, mult := s, int64(1)
	for _, m := range diskSuffixes {
		if strings.HasSuffix(s, m.suffix) {
			num, mult = strings.TrimSuffix(s, m.suffix), m.mult
			break
		}
	}
	v, err := strconv.ParseFloat(num, 64)
	if err != nil || math.IsNaN(v) || v <= 0 || v*float64(mult) > math.MaxInt64/2 || int64(v*float64(mult)) < minDisk {
		return 0, fmt.Errorf("disk %q: want bytes or a quantity such as \"500Mi\" or \"2Gi\", at least 16Mi, or \"0\" for no limit: %w", s, errdefs.ErrInvalidArgument)
	}
	return int64(v * float64(mult)), nil
}

// applyDisk sets cfg's disk limit from a caller's string ("" leaves cfg as
// it is: a create keeps the daemon's default, a fork inherits).
func applyDisk(cfg *store.SandboxConfig, s string) error {
	if s == "" {
		return nil
	}
	b, err := ParseDisk(s)
	if err != nil {
		return err
	}
	cfg.DiskBytes, cfg.DiskStr = b, s
	return nil
}

// diskLimit is the limit a sandbox's writable layer gets: its own, or the
// daemon's default when it asked for none and the snapshotter can enforce
// one (0 = none).
func (d *Daemon) diskLimit(cfg store.SandboxConfig) int64 {
	if cfg.DiskStr != "" {
		return cfg.DiskBytes
	}
	if d.cfg.Snapshotter == "copy" {
		return 0
	}
	return d.cfg.DefaultDisk
}

// diskOpts are the Prepare options of a sandbox's writable layer:
//
//	d.snaps.Prepare(ctx, sb.ID, parentSnapshot, d.diskOpts(sb.Config)...)
func (d *Daemon) diskOpts(cfg store.SandboxConfig) []snapshot.Opt {
	if n := d.diskLimit(cfg); n > 0 {
		return []snapshot.Opt{snapshot.WithDiskLimit(n)}
	}
	return nil
}

// checkDisk refuses, before anything is made, a limit this daemon cannot
// enforce.
func (d *Daemon) checkDisk(cfg store.SandboxConfig) error {
	if cfg.DiskStr != "" && cfg.DiskBytes > 0 && d.cfg.Snapshotter == "copy" {
		return fmt.Errorf("disk %q: the copy snapshotter cannot limit a sandbox's disk use; run the daemon with the btrfs snapshotter, or ask for disk \"0\": %w", cfg.DiskStr, errdefs.ErrFailedPrecondition)
	}
	return nil
}

// warnDiskDefault logs, once at start, that the default limit is not
// enforced by the copy snapshotter.
func (d *Daemon) warnDiskDefault() {
	if d.cfg.DefaultDisk > 0 && d.cfg.Snapshotter == "copy" {
		d.log.Warn("the copy snapshotter cannot limit disk use: --default-disk is not enforced, and sandboxes that ask for a disk limit are refused")
	}
}

// diskFull gives an error from writing the state directory or the pool the
// class ResourceExhausted, with a message that says so, when the cause is a
// full filesystem or quota; other errors are returned as they are. Wrap the
// errors of the steps of create, fork and checkpoint that write to disk:
//
//	return diskFull("write the bundle", err)
func diskFull(what string, err error) error {
	if err == nil || errdefs.IsResourceExhausted(err) {
		return err
	}
	if errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT) {
		return fmt.Errorf("%s: the host's disk for sandboxes is full (%v): %w", what, err, errdefs.ErrResourceExhausted)
	}
	return err
}

// securePrivateDir makes dir (the state directory) root's and 0700, whatever
// created it: everything below it (image layers, with whatever setuid
// files and device nodes images carry; the snapshot pool; bundles) is then
// out of reach of other host users. Call it in New, after creating the
// state dir:
//
//	if err := securePrivateDir(cfg.StateDir); err != nil { ... }
func securePrivateDir(dir string) error {
	if err := os.Chown(dir, 0, 0); err != nil {
		return fmt.Errorf("state dir %s: %v: %w", dir, err, errdefs.ErrPermissionDenied)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return fmt.Errorf("state dir %s: %v: %w", dir, err, errdefs.ErrPermissionDenied)
	}
	return nil
}
