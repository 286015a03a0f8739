package daemon

import (
	"fmt"
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/snapshot"
	"github.com/forkbox/forkbox/internal/store"
)

func TestParseDisk(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		ok   bool
	}{
		{"", 0, true},
		{"0", 0, true},
		{"2Gi", 2 << 30, true},
		{"500Mi", 500 << 20, true},
		{"1.5Gi", 3 << 29, true},
		{"10G", 10e9, true},
		{"16777216", 16 << 20, true},
		{"1Mi", 0, false},
		{"-1Gi", 0, false},
		{"lots", 0, false},
		{"2XB", 0, false},
		{"NaNGi", 0, false},
		{"99999999Ti", 0, false},
	} {
		got, err := ParseDisk(tc.in)
		if tc.ok != (err == nil) || got != tc.want {
			t.Errorf("ParseDisk(%q): got %d, %v, want %d, ok=%v", tc.in, got, err, tc.want, tc.ok)
		}
		if err != nil && !errdefs.IsInvalidArgument(err) {
			t.Errorf("ParseDisk(%q): got class %v, want InvalidArgument", tc.in, err)
		}
	}
}

func TestDiskLimit(t *testing.T) {
	btrfs := &Daemon{cfg: Config{Snapshotter: "btrfs", DefaultDisk: DefaultDisk}}
	copySn := &Daemon{cfg: Config{Snapshotter: "copy", DefaultDisk: DefaultDisk}}
	none := &Daemon{cfg: Config{Snapshotter: "btrfs"}}
	asked := func(s string) store.SandboxConfig {
		var cfg store.SandboxConfig
		if err := applyDisk(&cfg, s); err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	for _, tc := range []struct {
		name string
		d    *Daemon
		cfg  store.SandboxConfig
		want int64
	}{
		{"nothing asked: default", btrfs, asked(""), DefaultDisk},
		{"asked", btrfs, asked("1Gi"), 1 << 30},
		{"asked none", btrfs, asked("0"), 0},
		{"no default", none, asked(""), 0},
		{"copy: default not applied", copySn, asked(""), 0},
		{"copy: asked", copySn, asked("1Gi"), 1 << 30},
	} {
		if got := tc.d.diskLimit(tc.cfg); got != tc.want {
			t.Errorf("%s: diskLimit: got %d, want %d", tc.name, got, tc.want)
		}
		var info snapshot.Info
		for _, o := range tc.d.diskOpts(tc.cfg) {
			o(&info)
		}
		if info.DiskLimit != tc.want {
			t.Errorf("%s: diskOpts: got limit %d, want %d", tc.name, info.DiskLimit, tc.want)
		}
	}
	if err := copySn.checkDisk(asked("1Gi")); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("copy snapshotter, disk asked: got %v, want FailedPrecondition", err)
	}
	for _, s := range []string{"", "0"} {
		if err := copySn.checkDisk(asked(s)); err != nil {
			t.Errorf("copy snapshotter, disk %q: got %v, want nil", s, err)
		}
	}
	if err := btrfs.checkDisk(asked("1Gi")); err != nil {
		t.Errorf("btrfs, disk asked: got %v, want nil", err)
	}
	// A fork inherits: "" keeps the parent's; an override replaces it.
	cfg := asked("1Gi")
	if err := applyDisk(&cfg, ""); err != nil || cfg.DiskBytes != 1<<30 {
		t.Errorf("inherit: got %d, %v", cfg.DiskBytes, err)
	}
	if err := applyDisk(&cfg, "0"); err != nil || btrfs.diskLimit(cfg) != 0 {
		t.Errorf("override with 0: got %d, %v, want no limit", btrfs.diskLimit(cfg), err)
	}
}

func TestDiskFull(t *testing.T) {
	for _, tc := range []struct {
		err  error
		full bool
	}{
		{&os.PathError{Op: "write", Path: "/x", Err: unix.ENOSPC}, true},
		{fmt.Errorf("wrapped: %w", unix.EDQUOT), true},
		{fmt.Errorf("already: %w", errdefs.ErrResourceExhausted), true},
		{&os.PathError{Op: "open", Path: "/x", Err: unix.ENOENT}, false},
	} {
		got := diskFull("write", tc.err)
		if errdefs.IsResourceExhausted(got) != tc.full {
			t.Errorf("diskFull(%v): got %v, want ResourceExhausted=%v", tc.err, got, tc.full)
		}
	}
	if diskFull("x", nil) != nil {
		t.Errorf("diskFull(nil) != nil")
	}
}

func TestSecurePrivateDir(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to chown")
	}
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	if err := securePrivateDir(dir); err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		t.Fatal(err)
	}
	if st.Mode&0o7777 != 0o700 || st.Uid != 0 || st.Gid != 0 {
		t.Errorf("state dir: got mode %o owner %d:%d, want 0700 root:root", st.Mode&0o7777, st.Uid, st.Gid)
	}
}
