package testsuite

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/snapshot"
)

type reopenFunc = func() snapshot.Snapshotter

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func testPrepareAndMount(t *testing.T, ctx context.Context, s snapshot.Snapshotter, _ reopenFunc) {
	lower := makeLower(t)
	must(t, s.Prepare(ctx, "sb1", "", snapshot.WithLabels(map[string]string{"sandbox": "sb1"})))
	info, err := s.Stat(ctx, "sb1")
	must(t, err)
	if info.Key != "sb1" || info.Kind != snapshot.KindActive || info.Parent != "" || info.Labels["sandbox"] != "sb1" || info.Created.IsZero() {
		t.Errorf("Stat: got %+v", info)
	}
	root, _ := MountRootfs(t, s, "sb1", []string{lower})
	expect(t, filepath.Join(root, "etc/os-release"), "lower")
	write(t, filepath.Join(root, "etc/hostname"), "sb1")
	write(t, filepath.Join(root, "new/file"), "new")
	expect(t, filepath.Join(root, "etc/hostname"), "sb1")
	expect(t, filepath.Join(lower, "etc/hostname"), "base") // lowers stay untouched
}

// testCommitAndFork commits a mounted, live snapshot and forks two children.
func testCommitAndFork(t *testing.T, ctx context.Context, s snapshot.Snapshotter, _ reopenFunc) {
	base, top := makeLower(t), t.TempDir()
	write(t, filepath.Join(top, "etc/os-release"), "top") // top layer shadows base
	lowers := []string{base, top}                         // base first

	must(t, s.Prepare(ctx, "parent", ""))
	proot, _ := MountRootfs(t, s, "parent", lowers)
	expect(t, filepath.Join(proot, "etc/os-release"), "top")
	write(t, filepath.Join(proot, "f1"), "one")
	must(t, os.Remove(filepath.Join(proot, "etc/hostname"))) // whiteout
	must(t, os.RemoveAll(filepath.Join(proot, "opt")))       // whiteout dir
	must(t, os.MkdirAll(filepath.Join(proot, "opt"), 0o755)) // opaque dir
	write(t, filepath.Join(proot, "opt/c"), "c")

	must(t, s.Commit(ctx, "ckpt", "parent", snapshot.WithLabels(map[string]string{"k": "v"})))
	info, err := s.Stat(ctx, "ckpt")
	must(t, err)
	if info.Kind != snapshot.KindCommitted || info.Parent != "" || info.Labels["k"] != "v" {
		t.Errorf("Stat(ckpt): got %+v", info)
	}
	// The parent keeps running and writing after the commit.
	write(t, filepath.Join(proot, "f1"), "parent")
	write(t, filepath.Join(proot, "f2"), "after")

	for _, child := range []string{"child1", "child2"} {
		must(t, s.Prepare(ctx, child, "ckpt"))
		info, err := s.Stat(ctx, child)
		must(t, err)
		if info.Kind != snapshot.KindActive || info.Parent != "ckpt" {
			t.Errorf("Stat(%s): got %+v", child, info)
		}
		croot, _ := MountRootfs(t, s, child, lowers)
		expect(t, filepath.Join(croot, "f1"), "one")
		expectAbsent(t, filepath.Join(croot, "f2"))
		expectAbsent(t, filepath.Join(croot, "etc/hostname"))
		expectAbsent(t, filepath.Join(croot, "opt/a"))
		expect(t, filepath.Join(croot, "opt/c"), "c")
		expect(t, filepath.Join(croot, "etc/os-release"), "top")
		write(t, filepath.Join(croot, "f1"), child)
		expect(t, filepath.Join(croot, "f1"), child)
	}
	expect(t, filepath.Join(proot, "f1"), "parent")

	// A second commit of the same parent sees its later writes.
	must(t, s.Commit(ctx, "ckpt2", "parent"))
	must(t, s.Prepare(ctx, "child3", "ckpt2"))
	croot, _ := MountRootfs(t, s, "child3", lowers)
	expect(t, filepath.Join(croot, "f1"), "parent")
	expect(t, filepath.Join(croot, "f2"), "after")

	// A fork of a fork.
	must(t, s.Commit(ctx, "ckpt3", "child3"))
	if info, _ := s.Stat(ctx, "ckpt3"); info.Parent != "ckpt2" {
		t.Errorf("Stat(ckpt3).Parent: got %q, want ckpt2", info.Parent)
	}
	must(t, s.Prepare(ctx, "child4", "ckpt3"))
	c4, _ := MountRootfs(t, s, "child4", lowers)
	expect(t, filepath.Join(c4, "f2"), "after")
}

func testErrorClasses(t *testing.T, ctx context.Context, s snapshot.Snapshotter, _ reopenFunc) {
	must(t, s.Prepare(ctx, "a", ""))
	must(t, s.Commit(ctx, "c", "a"))
	for _, tc := range []struct {
		name  string
		err   error
		class error
	}{
		{"Prepare existing active", s.Prepare(ctx, "a", ""), errdefs.ErrAlreadyExists},
		{"Prepare over committed name", s.Prepare(ctx, "c", ""), errdefs.ErrAlreadyExists},
		{"Prepare missing parent", s.Prepare(ctx, "b", "nope"), errdefs.ErrNotFound},
		{"Prepare from active parent", s.Prepare(ctx, "b", "a"), errdefs.ErrFailedPrecondition},
		{"Prepare bad key", s.Prepare(ctx, "../x", ""), errdefs.ErrInvalidArgument},
		{"Prepare empty key", s.Prepare(ctx, "", ""), errdefs.ErrInvalidArgument},
		{"Commit existing name", s.Commit(ctx, "c", "a"), errdefs.ErrAlreadyExists},
		{"Commit over active key", s.Commit(ctx, "a", "a"), errdefs.ErrAlreadyExists},
		{"Commit missing key", s.Commit(ctx, "d", "nope"), errdefs.ErrNotFound},
		{"Commit committed", s.Commit(ctx, "d", "c"), errdefs.ErrFailedPrecondition},
		{"Stat missing", func() error { _, err := s.Stat(ctx, "nope"); return err }(), errdefs.ErrNotFound},
		{"Usage missing", func() error { _, err := s.Usage(ctx, "nope"); return err }(), errdefs.ErrNotFound},
		{"Charged missing", func() error { _, err := s.Charged(ctx, "nope"); return err }(), errdefs.ErrNotFound},
		{"Mounts committed", func() error { _, err := s.Mounts(ctx, "c", nil); return err }(), errdefs.ErrFailedPrecondition},
		{"Mounts missing", func() error { _, err := s.Mounts(ctx, "nope", nil); return err }(), errdefs.ErrNotFound},
		{"Mounts relative lower", func() error { _, err := s.Mounts(ctx, "a", []string{"rel"}); return err }(), errdefs.ErrInvalidArgument},
		{"Prepare negative disk limit", s.Prepare(ctx, "b", "", snapshot.WithDiskLimit(-1)), errdefs.ErrInvalidArgument},
		{"Commit with disk limit", s.Commit(ctx, "d", "a", snapshot.WithDiskLimit(1<<20)), errdefs.ErrInvalidArgument},
		{"Remove missing", s.Remove(ctx, "nope"), errdefs.ErrNotFound},
		{"Remove bad key", s.Remove(ctx, "a/b"), errdefs.ErrInvalidArgument},
	} {
		if !errors.Is(tc.err, tc.class) {
			t.Errorf("%s: got %v, want class %v", tc.name, tc.err, tc.class)
		}
	}
	if _, err := s.Stat(ctx, "b"); !errdefs.IsNotFound(err) {
		t.Errorf("failed Prepare left b behind: Stat: %v", err)
	}
	if _, err := s.Stat(ctx, "d"); !errdefs.IsNotFound(err) {
		t.Errorf("failed Commit left d behind: Stat: %v", err)
	}
}

func testRemove(t *testing.T, ctx context.Context, s snapshot.Snapshotter, _ reopenFunc) {
	lower := makeLower(t)
	must(t, s.Prepare(ctx, "p", ""))
	root, unmount := MountRootfs(t, s, "p", []string{lower})
	write(t, filepath.Join(root, "data"), "kept")
	must(t, s.Commit(ctx, "c", "p"))
	if err := s.Remove(ctx, "p"); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("Remove of mounted active: got %v, want FailedPrecondition", err)
	}
	unmount()
	must(t, s.Remove(ctx, "p"))
	if _, err := s.Stat(ctx, "p"); !errdefs.IsNotFound(err) {
		t.Errorf("Stat after Remove: got %v, want NotFound", err)
	}
	if err := s.Remove(ctx, "p"); !errdefs.IsNotFound(err) {
		t.Errorf("second Remove: got %v, want NotFound", err)
	}
	// Children are independent of their parent.
	must(t, s.Prepare(ctx, "child", "c"))
	must(t, s.Remove(ctx, "c"))
	croot, _ := MountRootfs(t, s, "child", []string{lower})
	expect(t, filepath.Join(croot, "data"), "kept")
	// The key can be reused.
	must(t, s.Prepare(ctx, "p", ""))
	infos, err := s.List(ctx)
	must(t, err)
	if len(infos) != 2 || infos[0].Key != "child" || infos[1].Key != "p" {
		t.Errorf("List: got %+v, want child and p", infos)
	}
}

func testRestart(t *testing.T, ctx context.Context, s snapshot.Snapshotter, reopen reopenFunc) {
	lower := makeLower(t)
	must(t, s.Prepare(ctx, "p", ""))
	root, unmount := MountRootfs(t, s, "p", []string{lower})
	write(t, filepath.Join(root, "x"), "x")
	must(t, s.Commit(ctx, "c", "p"))
	must(t, s.Prepare(ctx, "child", "c"))
	unmount()
	before, err := s.List(ctx)
	must(t, err)

	s = reopen()
	after, err := s.List(ctx)
	must(t, err)
	if got, want := fmt.Sprint(after), fmt.Sprint(before); got != want {
		t.Errorf("List after restart: got %s, want %s", got, want)
	}
	must(t, s.Prepare(ctx, "child2", "c"))
	croot, _ := MountRootfs(t, s, "child2", []string{lower})
	expect(t, filepath.Join(croot, "x"), "x")
	root, _ = MountRootfs(t, s, "p", []string{lower})
	expect(t, filepath.Join(root, "x"), "x")
}

func testMany(t *testing.T, ctx context.Context, s snapshot.Snapshotter, _ reopenFunc) {
	const n = 40
	must(t, s.Prepare(ctx, "base", ""))
	for i := 0; i < n; i++ {
		must(t, s.Commit(ctx, fmt.Sprintf("c%02d", i), "base"))
		must(t, s.Prepare(ctx, fmt.Sprintf("a%02d", i), fmt.Sprintf("c%02d", i)))
	}
	infos, err := s.List(ctx)
	must(t, err)
	if len(infos) != 2*n+1 {
		t.Fatalf("List: got %d snapshots, want %d", len(infos), 2*n+1)
	}
	for i := 0; i < n; i++ {
		must(t, s.Remove(ctx, fmt.Sprintf("a%02d", i)))
		must(t, s.Remove(ctx, fmt.Sprintf("c%02d", i)))
	}
	infos, err = s.List(ctx)
	must(t, err)
	if len(infos) != 1 {
		t.Errorf("List after removals: got %d, want 1", len(infos))
	}
}

func testUsage(t *testing.T, ctx context.Context, s snapshot.Snapshotter, _ reopenFunc) {
	must(t, s.Prepare(ctx, "u", ""))
	empty, err := s.Usage(ctx, "u")
	must(t, err)
	root, _ := MountRootfs(t, s, "u", []string{makeLower(t)})
	big := make([]byte, 4<<20)
	for i := range big {
		big[i] = byte(i * 7)
	}
	must(t, os.WriteFile(filepath.Join(root, "big"), big, 0o644))
	must(t, os.Link(filepath.Join(root, "big"), filepath.Join(root, "big-link")))
	f, err := os.Open(filepath.Join(root, "big"))
	must(t, err)
	must(t, f.Sync())
	f.Close()
	got, err := s.Usage(ctx, "u")
	must(t, err)
	if got < empty+4<<20 || got > empty+5<<20 {
		t.Errorf("Usage: got %d, want about %d (hard link counted once)", got, empty+4<<20)
	}
	// Without a limit, Charged is at least what was written.
	must(t, syncfs(root))
	if ch, err := s.Charged(ctx, "u"); err != nil || ch < 4<<20 || ch > empty+5<<20 {
		t.Errorf("Charged: got %d, %v, want about %d", ch, err, 4<<20)
	}
	must(t, s.Commit(ctx, "uc", "u"))
	if cu, err := s.Usage(ctx, "uc"); err != nil || cu < 4<<20 {
		t.Errorf("Usage(committed): got %d, %v, want >= 4 MiB", cu, err)
	}
}

func testNoLowers(t *testing.T, ctx context.Context, s snapshot.Snapshotter, _ reopenFunc) {
	must(t, s.Prepare(ctx, "plain", ""))
	root, _ := MountRootfs(t, s, "plain", nil)
	write(t, filepath.Join(root, "f"), "f")
	must(t, s.Commit(ctx, "pc", "plain"))
	must(t, s.Prepare(ctx, "pchild", "pc"))
	croot, _ := MountRootfs(t, s, "pchild", nil)
	expect(t, filepath.Join(croot, "f"), "f")
}
