package btrfs_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/forkbox/forkbox/internal/mount"
	"github.com/forkbox/forkbox/internal/snapshot"
	"github.com/forkbox/forkbox/internal/snapshot/btrfs"
	"github.com/forkbox/forkbox/internal/snapshot/testsuite"
)

const testLoopSize = 2 << 30

// open opens a btrfs snapshotter on a loop-backed image under root's parent
// and detaches it in t.Cleanup, checking that no loop device is left.
func open(t testing.TB, root string) snapshot.Snapshotter {
	t.Helper()
	ctx := context.Background()
	testsuite.Require(t, btrfs.Supported(ctx) == nil, "btrfs unsupported here")
	s, err := btrfs.Open(ctx, root, btrfs.Options{LoopSize: testLoopSize})
	if err != nil {
		t.Fatalf("btrfs.Open: %v", err)
	}
	t.Cleanup(func() { detach(t, root) })
	return s
}

func detach(t testing.TB, root string) {
	t.Helper()
	if err := btrfs.Detach(context.Background(), root); err != nil {
		t.Errorf("Detach: %v", err)
	}
	if mp, _ := mount.IsMountPoint(root); mp {
		t.Errorf("%s still mounted after Detach", root)
	}
	if devs := btrfs.LoopDevices(root); len(devs) > 0 {
		t.Errorf("loop devices %v still attached after Detach", devs)
	}
}

func TestConformance(t *testing.T) {
	testsuite.Run(t, open)
}

func TestOpenLoopLifecycle(t *testing.T) {
	ctx := context.Background()
	root := filepath.Join(t.TempDir(), "snaps")
	s := open(t, root)
	if devs := btrfs.LoopDevices(root); len(devs) != 1 {
		t.Fatalf("LoopDevices after Open: got %v, want one", devs)
	}
	if err := s.Prepare(ctx, "a", ""); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// Close leaves the filesystem mounted; a reopen reuses it.
	if mp, _ := mount.IsMountPoint(root); !mp {
		t.Fatalf("%s not mounted after Close", root)
	}
	s = open(t, root)
	if _, err := s.Stat(ctx, "a"); err != nil {
		t.Fatalf("Stat after reopen: %v", err)
	}
	s.Close()
	// After Detach, Open re-attaches the existing image without mkfs.
	detach(t, root)
	s = open(t, root)
	defer s.Close()
	if _, err := s.Stat(ctx, "a"); err != nil {
		t.Fatalf("Stat after re-attach: %v", err)
	}
	if _, err := os.Stat(root + ".img"); err != nil {
		t.Fatalf("image: %v", err)
	}
}

func TestCommitIsReadOnly(t *testing.T) {
	ctx := context.Background()
	root := filepath.Join(t.TempDir(), "snaps")
	s := open(t, root)
	defer s.Close()
	if err := s.Prepare(ctx, "a", ""); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(ctx, "c", "a"); err != nil {
		t.Fatal(err)
	}
	err := os.WriteFile(filepath.Join(root, "committed", "c", "upper", "x"), nil, 0o644)
	if err == nil {
		t.Errorf("write into committed snapshot: got nil error, want EROFS")
	}
}

// BenchmarkCommit: commit+prepare must not grow with the data in the upper.
//
//	go test -run XXX -bench Commit -benchtime 20x ./internal/snapshot/btrfs/
func BenchmarkCommit(b *testing.B) {
	testsuite.BenchmarkCommit(b, openBench, testsuite.Size1MB, testsuite.Size100MB, testsuite.Size1GB)
}

// BenchmarkCommitLimit: the same with disk limits (simple quotas), source
// and children limited to 2 GiB.
//
//	go test -run XXX -bench CommitLimit -benchtime 20x ./internal/snapshot/btrfs/
func BenchmarkCommitLimit(b *testing.B) {
	testsuite.BenchmarkCommitLimit(b, openBench, 2<<30, testsuite.Size1MB, testsuite.Size100MB, testsuite.Size1GB)
}

func openBench(t testing.TB, root string) snapshot.Snapshotter {
	t.Helper()
	ctx := context.Background()
	testsuite.Require(t, btrfs.Supported(ctx) == nil, "btrfs unsupported here")
	s, err := btrfs.Open(ctx, root, btrfs.Options{LoopSize: 8 << 30})
	if err != nil {
		t.Fatalf("btrfs.Open: %v", err)
	}
	t.Cleanup(func() { detach(t, root) })
	return s
}

// TestCrashLeftovers simulates crashes: data gone but metadata left, a
// tombstone not yet deleted, a data dir whose metadata was never written.
func TestCrashLeftovers(t *testing.T) {
	ctx := context.Background()
	root := filepath.Join(t.TempDir(), "snaps")
	s := open(t, root)
	for _, err := range []error{s.Prepare(ctx, "a", ""), s.Commit(ctx, "c", "a"), s.Prepare(ctx, "b", "c")} {
		if err != nil {
			t.Fatal(err)
		}
	}
	s.Close()
	if err := os.Rename(filepath.Join(root, "active", "a"), filepath.Join(root, "tmp", "rm-crash")); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(root, "tmp", "rm-crash2", "upper", "x"), 0o755); err != nil {
		t.Fatal(err)
	}
	// A snapshot made but not yet recorded in meta/.
	if err := os.MkdirAll(filepath.Join(root, "active", "orphan", "upper"), 0o755); err != nil {
		t.Fatal(err)
	}
	// Metadata written but not yet renamed into place (its commit point).
	if err := os.WriteFile(filepath.Join(root, "meta", "orphan.json.tmp"), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	s = open(t, root)
	defer s.Close()
	if ents, _ := os.ReadDir(filepath.Join(root, "tmp")); len(ents) != 0 {
		t.Errorf("tmp after reopen: got %d entries, want 0", len(ents))
	}
	if _, err := os.Stat(filepath.Join(root, "meta", "orphan.json.tmp")); !os.IsNotExist(err) {
		t.Errorf("half-written metadata after reopen: got %v, want it swept", err)
	}
	if _, err := os.Stat(filepath.Join(root, "active", "orphan")); !os.IsNotExist(err) {
		t.Errorf("orphan data dir after reopen: got %v, want it swept", err)
	}
	infos, err := s.List(ctx)
	if err != nil || len(infos) != 2 || infos[0].Key != "b" || infos[1].Key != "c" {
		t.Errorf("List: got %+v, %v, want b and c", infos, err)
	}
}
