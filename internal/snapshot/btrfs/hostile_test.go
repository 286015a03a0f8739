package btrfs_test

import (
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/internal/mount"
	"github.com/forkbox/forkbox/internal/snapshot/testsuite"
)

// TestPoolNosuidNodev: a setuid file or a device node that a sandbox writes
// into its layer works inside its rootfs, and does nothing through the
// pool's host-side path; the pool is mounted nosuid,nodev and is 0700.
func TestPoolNosuidNodev(t *testing.T) {
	ctx := context.Background()
	root := filepath.Join(t.TempDir(), "snaps")
	s := open(t, root)
	defer s.Close()
	checkPool(t, root)

	if err := s.Prepare(ctx, "a", ""); err != nil {
		t.Fatal(err)
	}
	rootfs, unmount := testsuite.MountRootfs(t, s, "a", []string{t.TempDir()})
	// A setuid-nobody copy of id(1): run by root, it prints 65534 where
	// setuid is honoured and 0 where it is not.
	idsu := filepath.Join(rootfs, "idsu")
	copyFile(t, "/usr/bin/id", idsu)
	if err := os.Chown(idsu, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	if err := unix.Chmod(idsu, 0o4755); err != nil { // os.Chmod has its own setuid bit
		t.Fatal(err)
	}
	if err := unix.Mknod(filepath.Join(rootfs, "null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
		t.Fatal(err)
	}
	upper := filepath.Join(root, "active", "a", "upper")

	if got := euid(t, idsu); got != "65534" {
		t.Errorf("setuid file in the sandbox's rootfs: euid %s, want 65534 (setuid honoured inside)", got)
	}
	if got := euid(t, filepath.Join(upper, "idsu")); got != "0" {
		t.Errorf("setuid file through the pool path: euid %s, want 0 (nosuid)", got)
	}
	if f, err := os.OpenFile(filepath.Join(rootfs, "null"), os.O_WRONLY, 0); err != nil {
		t.Errorf("device node in the sandbox's rootfs: %v, want it usable", err)
	} else {
		f.Close()
	}
	if f, err := os.OpenFile(filepath.Join(upper, "null"), os.O_WRONLY, 0); !errors.Is(err, unix.EACCES) {
		t.Errorf("device node through the pool path: got %v, want EACCES (nodev)", err)
		if err == nil {
			f.Close()
		}
	}

	// A reopen (a restarted daemon) keeps the flags, and so does a pool
	// that was mounted by someone else without them.
	unmount()
	s.Close()
	if err := unix.Mount("", root, "", unix.MS_REMOUNT|unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	s = open(t, root)
	defer s.Close()
	checkPool(t, root)
}

func checkPool(t *testing.T, root string) {
	t.Helper()
	infos, err := mount.List()
	if err != nil {
		t.Fatal(err)
	}
	var opts []string
	for _, in := range infos {
		if in.Mountpoint == root {
			opts = strings.Split(in.Options, ",") // the last mount on root wins
		}
	}
	for _, want := range []string{"nosuid", "nodev", "rw"} {
		if !slices.Contains(opts, want) {
			t.Errorf("pool mount options %v: want %s", opts, want)
		}
	}
	if fi, err := os.Stat(root); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("pool root: got %v, %v, want mode 0700", fi.Mode(), err)
	}
}

func euid(t *testing.T, bin string) string {
	t.Helper()
	out, err := exec.Command(bin, "-u").Output()
	if err != nil {
		t.Fatalf("%s -u: %v", bin, err)
	}
	return strings.TrimSpace(string(out))
}

func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	in, err := os.Open(src)
	if err != nil {
		t.Skipf("no %s: %v", src, err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}
