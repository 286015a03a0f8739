// Package testsuite is the conformance suite that every snapshot.Snapshotter
// implementation runs: overlay mounts over real lower directories, commit
// and fork divergence, whiteouts, error classes, removal, restart, usage
// and disk limits.
package testsuite

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/forkbox/forkbox/internal/mount"
	"github.com/forkbox/forkbox/internal/snapshot"
)

// Opener opens the snapshotter under test at root. The suite calls it again
// with the same root to check that state survives a restart, after closing
// the first instance. It fails t on error and registers any cleanup (such
// as unmounting a backing filesystem) with t.Cleanup.
type Opener func(t testing.TB, root string) snapshot.Snapshotter

// Run runs the conformance suite against the snapshotter that open makes.
func Run(t *testing.T, open Opener) {
	Require(t, os.Geteuid() == 0, "needs root to mount overlays")
	for _, tc := range []struct {
		name string
		fn   func(t *testing.T, ctx context.Context, s snapshot.Snapshotter, reopen func() snapshot.Snapshotter)
	}{
		{"PrepareAndMount", testPrepareAndMount},
		{"CommitAndFork", testCommitAndFork},
		{"ErrorClasses", testErrorClasses},
		{"Remove", testRemove},
		{"Restart", testRestart},
		{"Many", testMany},
		{"Usage", testUsage},
		{"NoLowers", testNoLowers},
		{"DiskLimit", testDiskLimit},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := filepath.Join(t.TempDir(), "snapshots")
			// Close each instance before the cleanups its Opener
			// registered (which may unmount the backing filesystem).
			openClosed := func() snapshot.Snapshotter {
				s := open(t, root)
				t.Cleanup(func() { _ = s.Close() })
				return s
			}
			s := openClosed()
			cur := s
			reopen := func() snapshot.Snapshotter {
				if err := cur.Close(); err != nil {
					t.Fatalf("Close: %v", err)
				}
				cur = openClosed()
				return cur
			}
			tc.fn(t, context.Background(), s, reopen)
		})
	}
}

// Require skips t with reason when ok is false, or fails it when CI=true.
func Require(t testing.TB, ok bool, reason string) {
	t.Helper()
	if ok {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("prerequisite missing in CI: %s", reason)
	}
	t.Skip(reason)
}

// MountRootfs mounts active snapshot key over lowers on a fresh directory
// and returns it, with a func that unmounts it early. The mount is also
// undone in t.Cleanup.
func MountRootfs(t testing.TB, s snapshot.Snapshotter, key string, lowers []string) (string, func()) {
	t.Helper()
	ctx := context.Background()
	ms, err := s.Mounts(ctx, key, lowers)
	if err != nil {
		t.Fatalf("Mounts(%q): %v", key, err)
	}
	target := t.TempDir()
	if err := mount.All(ctx, ms, target); err != nil {
		t.Fatalf("mount %q: %v", key, err)
	}
	unmount := func() {
		if err := mount.UnmountAll(ctx, target); err != nil {
			t.Errorf("unmount %s: %v", target, err)
		}
	}
	t.Cleanup(unmount)
	return target, unmount
}

// makeLower makes a read-only image layer directory with a few files.
func makeLower(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	write(t, filepath.Join(dir, "etc/os-release"), "lower")
	write(t, filepath.Join(dir, "etc/hostname"), "base")
	write(t, filepath.Join(dir, "opt/a"), "a")
	write(t, filepath.Join(dir, "opt/b"), "b")
	return dir
}

func write(t testing.TB, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func expect(t *testing.T, path, want string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Errorf("read %s: %v (want %q)", path, err, want)
		return
	}
	if string(b) != want {
		t.Errorf("%s: got %q, want %q", path, b, want)
	}
}

func expectAbsent(t *testing.T, path string) {
	t.Helper()
	if _, err := os.Lstat(path); !os.IsNotExist(err) {
		t.Errorf("%s: got err %v, want it absent", path, err)
	}
}
