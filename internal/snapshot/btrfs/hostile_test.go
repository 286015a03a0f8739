package btrfs_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/mount"
	"github.com/forkbox/forkbox/internal/snapshot"
	"github.com/forkbox/forkbox/internal/snapshot/btrfs"
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

// TestPoolFull: on a full pool, Prepare and Commit either work or fail with
// ResourceExhausted and leave nothing half-made; a preallocated image holds
// its whole size on the host, so the pool filling up takes nothing more
// from the host filesystem; freeing space makes the pool usable again.
func TestPoolFull(t *testing.T) {
	ctx := context.Background()
	testsuite.Require(t, btrfs.Supported(ctx) == nil, "btrfs unsupported here")
	const size = 256 << 20
	root := filepath.Join(t.TempDir(), "snaps")
	s, err := btrfs.Open(ctx, root, btrfs.Options{LoopSize: size, Preallocate: true})
	if err != nil {
		t.Fatalf("btrfs.Open: %v", err)
	}
	t.Cleanup(func() { detach(t, root) })
	defer s.Close()
	var st unix.Stat_t
	if err := unix.Stat(root+".img", &st); err != nil || st.Blocks*512 < size {
		t.Fatalf("preallocated image: %d bytes allocated, %v, want %d", st.Blocks*512, err, size)
	}
	hostBefore := st.Blocks

	if err := s.Prepare(ctx, "filler", ""); err != nil {
		t.Fatal(err)
	}
	rootfs, unmount := testsuite.MountRootfs(t, s, "filler", []string{t.TempDir()})
	// Data until ENOSPC, then small files (metadata) until ENOSPC.
	big, err := os.Create(filepath.Join(rootfs, "big"))
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1<<20)
	for i := 0; ; i++ {
		buf[0] = byte(i)
		if _, err = big.Write(buf); err == nil {
			continue
		}
		if !testsuite.IsDiskFull(err) {
			t.Fatalf("fill: got %v, want ENOSPC", err)
		}
		break
	}
	big.Close()
	for i := 0; ; i++ {
		err := os.WriteFile(filepath.Join(rootfs, fmt.Sprintf("s%06d", i)), []byte("x"), 0o644)
		if err == nil {
			continue
		}
		if !testsuite.IsDiskFull(err) {
			t.Fatalf("fill metadata: got %v, want ENOSPC", err)
		}
		t.Logf("pool full after %d small files", i)
		break
	}

	ops := []struct {
		key string
		op  func() error
	}{
		{"c", func() error { return s.Commit(ctx, "c", "filler") }},
		{"fresh", func() error { return s.Prepare(ctx, "fresh", "", snapshot.WithDiskLimit(1<<20)) }},
		{"child", func() error {
			if _, err := s.Stat(ctx, "c"); err != nil {
				return nil // the commit was refused: nothing to prepare from
			}
			return s.Prepare(ctx, "child", "c")
		}},
	}
	failed := 0
	for _, o := range ops {
		err := o.op()
		if err == nil {
			continue
		}
		failed++
		if !errdefs.IsResourceExhausted(err) {
			t.Errorf("%s on a full pool: got %v, want ResourceExhausted", o.key, err)
		}
		if _, serr := s.Stat(ctx, o.key); !errdefs.IsNotFound(serr) {
			t.Errorf("%s failed but left a snapshot: Stat: %v", o.key, serr)
		}
	}
	t.Logf("%d of %d operations refused on the full pool", failed, len(ops))
	if ents, _ := os.ReadDir(filepath.Join(root, "tmp")); len(ents) != 0 {
		t.Errorf("tmp after failures on a full pool: %d entries, want 0", len(ents))
	}
	if err := unix.Stat(root+".img", &st); err != nil || st.Blocks != hostBefore {
		t.Errorf("image on the host: %d blocks after the fill, %v, want %d (preallocated)", st.Blocks, err, hostBefore)
	}

	// Freeing space makes the pool usable again.
	unmount()
	for _, o := range ops {
		if _, err := s.Stat(ctx, o.key); err == nil {
			if err := s.Remove(ctx, o.key); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := s.Remove(ctx, "filler"); err != nil {
		t.Fatal(err)
	}
	// btrfs returns a removed subvolume's space in the background (its
	// cleaner, woken by a commit, then another commit). Prepare waits for
	// that when it meets a full pool, so the first one after the removal
	// succeeds.
	if err := s.Prepare(ctx, "again", ""); err != nil {
		out, _ := exec.Command("btrfs", "filesystem", "usage", root).CombinedOutput()
		t.Fatalf("Prepare right after freeing the pool: %v\n%s", err, out)
	}
	rootfs, _ = testsuite.MountRootfs(t, s, "again", []string{t.TempDir()})
	if err := os.WriteFile(filepath.Join(rootfs, "f"), make([]byte, 8<<20), 0o644); err != nil {
		t.Errorf("write after freeing the pool: %v", err)
	}
}
