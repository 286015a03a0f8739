package spec

import (
	"os"
	"slices"
	"syscall"
	"testing"

	"github.com/forkbox/forkbox/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// TestEtcFilesReadOnly: the identity files live outside the sandbox's
// writable layer and disk limit, so their bind mounts must be read-only.
func TestEtcFilesReadOnly(t *testing.T) {
	mounts, err := WriteEtcFiles(t.TempDir(), EtcFiles{Hostname: "sb-1"})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range mounts {
		for _, want := range []string{"ro", "nosuid", "nodev", "noexec"} {
			if !slices.Contains(m.Options, want) {
				t.Errorf("mount %s options %v: want %s", m.Destination, m.Options, want)
			}
		}
		if slices.Contains(m.Options, "rw") {
			t.Errorf("mount %s options %v: want no rw", m.Destination, m.Options)
		}
	}
	mounts[0].Options[0] = "changed"
	if mounts[1].Options[0] == "changed" || EtcMountOptions[0] == "changed" {
		t.Errorf("mounts share their options slice")
	}
}

func TestWriteClassFull(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want error
	}{
		{&os.PathError{Op: "write", Path: "/x", Err: syscall.ENOSPC}, errdefs.ErrResourceExhausted},
		{&os.PathError{Op: "write", Path: "/x", Err: syscall.EDQUOT}, errdefs.ErrResourceExhausted},
		{&os.PathError{Op: "write", Path: "/x", Err: syscall.EIO}, errdefs.ErrInternal},
	} {
		if got := writeClass(tc.err); got != tc.want {
			t.Errorf("writeClass(%v): got %v, want %v", tc.err, got, tc.want)
		}
	}
}

// A restore's bundle whose spec has hooks is not read: forkbox writes
// none, and the runtime would run them on the host as root.
func TestReadRestoreBundleRefusesHooks(t *testing.T) {
	dir := t.TempDir()
	s, err := NewSpec(SpecOptions{Rootfs: "/r", Args: []string{"sh"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := WriteBundle(dir, s); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadRestoreBundle(dir); err != nil {
		t.Fatalf("a bundle forkbox wrote: %v", err)
	}
	s.Hooks = &specs.Hooks{Prestart: []specs.Hook{{Path: "/bin/sh"}}}
	if err := WriteBundle(dir, s); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadRestoreBundle(dir); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("a bundle with hooks: got %v, want FailedPrecondition", err)
	}
}
