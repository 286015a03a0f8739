package runsc

// The view's boundaries (boundary.go): following the host's mounts, and
// the cases where the view stays a private copy.

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/internal/mount"
	"github.com/forkbox/forkbox/internal/runtime/testsuite"
)

// tmpfsAt mounts a small tmpfs on dir (made if missing) on the host, until
// the test ends.
func tmpfsAt(t *testing.T, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
}

// mountAtHost returns the host's topmost mount on path, or nil.
func mountAtHost(t *testing.T, path string) *mount.Info {
	t.Helper()
	infos, err := mount.List()
	if err != nil {
		t.Fatal(err)
	}
	return mount.Top(infos, path)
}

// mountsOn counts the host's mounts on path (stacked ones each count).
func mountsOn(t *testing.T, path string) int {
	t.Helper()
	infos, err := mount.List()
	if err != nil {
		t.Fatal(err)
	}
	return mount.CountAt(infos, path)
}

// TestViewFollowsHost: on a host whose mounts are shared (systemd's
// default), the view is a slave of them. A file system the host unmounts
// after the driver started leaves the view, instead of staying busy there
// until the daemon stops, and one it mounts later appears; the mounts made
// below a hidden directory still stay out. For that the hidden directory
// becomes a mount point of its own on the host (a boundary): Close leaves
// it while something is mounted below it (sandboxes outlive the daemon), a
// later start reuses it without stacking another, and a Close that finds
// nothing below unmounts it.
func TestViewFollowsHost(t *testing.T) {
	requireRunsc(t)
	area := sharedFS(t)
	hide := filepath.Join(area, "sandboxes")
	early, late, rootfs := filepath.Join(area, "early"), filepath.Join(area, "late"), filepath.Join(hide, "a", "rootfs")
	tmpfsAt(t, early)

	o := Options{HideMountsUnder: []string{hide}}
	rt := newRuntime(t, o)
	v := rt.view
	if v == nil || !v.follows {
		t.Fatalf("view %+v: want one that follows the host", v)
	}
	if mountsOn(t, hide) != 1 {
		t.Fatalf("%s is on %d mounts on the host, want 1 (the boundary)", hide, mountsOn(t, hide))
	}
	// The boundary is private, out of its parent's peer group: a sandbox
	// mount below it is not copied onto the parent as well.
	if in := mountAtHost(t, hide); in == nil || in.Shared() {
		t.Errorf("the boundary %+v is not a private mount", in)
	}
	tmpfsAt(t, late)
	tmpfsAt(t, rootfs)
	in := viewMounts(t, v)
	if !in[early] || !in[late] {
		t.Errorf("the view has the host's %s: %v, %s (mounted after start): %v; want both", early, in[early], late, in[late])
	}
	if in[rootfs] {
		t.Errorf("%s, mounted below the hidden directory after start, is in the view", rootfs)
	}
	if n := mountsOn(t, rootfs); n != 1 {
		t.Errorf("%s is on %d mounts on the host, want 1", rootfs, n)
	}
	if err := unix.Unmount(early, 0); err != nil {
		t.Fatalf("the host unmounts %s: %v", early, err)
	}
	if viewMounts(t, v)[early] {
		t.Errorf("the view still holds %s after the host unmounted it", early)
	}

	if err := rt.Close(); err != nil {
		t.Fatal(err)
	}
	if mountsOn(t, hide) != 1 {
		t.Errorf("after Close with %s mounted below it: %d mounts on %s, want the boundary kept", rootfs, mountsOn(t, hide), hide)
	}
	if err := unix.Unmount(rootfs, 0); err != nil {
		t.Fatal(err)
	}
	rt2 := newRuntime(t, o)
	if rt2.view == nil || !rt2.view.follows || mountsOn(t, hide) != 1 {
		t.Errorf("a second start: view %+v, %d mounts on %s; want one that follows, on the boundary it found", rt2.view, mountsOn(t, hide), hide)
	}
	if err := rt2.Close(); err != nil {
		t.Fatal(err)
	}
	if n := mountsOn(t, hide); n != 0 {
		t.Errorf("after Close with nothing below it: %d mounts on %s, want the boundary gone", n, hide)
	}
}

// A hidden directory with mounts below it that is no mount point (sandboxes
// of a version that made no boundary) cannot be cut from the host's
// propagation: the view is then a private copy, still without those
// mounts, and nothing is stacked on the directory.
func TestViewPrivateWithoutBoundary(t *testing.T) {
	requireRunsc(t)
	hide := filepath.Join(t.TempDir(), "sandboxes")
	rootfs := filepath.Join(hide, "a", "rootfs")
	tmpfsAt(t, rootfs)
	rt := newRuntime(t, Options{HideMountsUnder: []string{hide}})
	if rt.view == nil || rt.view.follows {
		t.Fatalf("view %+v: want a private one", rt.view)
	}
	if n := mountsOn(t, hide); n != 0 {
		t.Errorf("%d mounts on %s, want none", n, hide)
	}
	if viewMounts(t, rt.view)[rootfs] {
		t.Errorf("%s is in the view", rootfs)
	}
}

// With SharedHidden (a Kubernetes node, whose sandbox mounts must reach the
// host through its Bidirectional volume), the hidden directories are left
// as they are, no boundary is made, and the view is a private copy, still
// without the mounts below them.
func TestViewSharedHidden(t *testing.T) {
	requireRunsc(t)
	hide := filepath.Join(t.TempDir(), "sandboxes")
	rt := newRuntime(t, Options{HideMountsUnder: []string{hide}, SharedHidden: true})
	if rt.view == nil || rt.view.follows {
		t.Fatalf("view %+v: want a private one", rt.view)
	}
	if n := mountsOn(t, hide); n != 0 {
		t.Errorf("%d mounts on %s, want none", n, hide)
	}
	rootfs := filepath.Join(hide, "a", "rootfs")
	tmpfsAt(t, rootfs)
	if viewMounts(t, rt.view)[rootfs] {
		t.Errorf("%s is in the view", rootfs)
	}
}

// sharedFS mounts a tmpfs of its own, shared, as a systemd host's every
// mount is, and returns its path.
func sharedFS(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "host")
	tmpfsAt(t, dir)
	if err := unix.Mount("", dir, "", unix.MS_SHARED, ""); err != nil {
		t.Fatal(err)
	}
	return dir
}

// bindSelf binds dir (made if missing) onto itself, until the test ends:
// on a shared mount, the bind joins that mount's peer group.
func bindSelf(t *testing.T, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(dir, dir, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
}

// Where a hidden directory cannot be cut from the host's propagation, the
// view is a private copy (it would get every sandbox mount below it), and
// nothing is left mounted: a mount point in a peer group with another
// mount (the netns directory an earlier version bound in its parent's
// group), and a directory whose bind would be copied onto another mount
// too (an ancestor bound onto itself in its parent's group), hidden where
// Close could not reach it.
func TestViewRefusesLeakyBoundary(t *testing.T) {
	requireRunsc(t)
	for _, tc := range []struct {
		name string
		prep func(base string) (hide string)
	}{
		{"a mount point in its parent's group", func(base string) string {
			hide := filepath.Join(base, "netns")
			bindSelf(t, hide)
			return hide
		}},
		{"a bind that would be copied", func(base string) string {
			bindSelf(t, filepath.Join(base, "state"))
			hide := filepath.Join(base, "state", "sandboxes")
			if err := os.MkdirAll(hide, 0o700); err != nil {
				t.Fatal(err)
			}
			return hide
		}},
	} {
		hide := tc.prep(sharedFS(t))
		had := mountsOn(t, hide)
		rt := newRuntime(t, Options{HideMountsUnder: []string{hide}})
		if rt.view == nil || rt.view.follows {
			t.Errorf("%s: view %+v, want a private one", tc.name, rt.view)
			continue
		}
		if n := mountsOn(t, hide); n != had {
			t.Errorf("%s: %d mounts on %s after the start, want %d as before", tc.name, n, hide, had)
		}
		rootfs := filepath.Join(hide, "a", "rootfs")
		tmpfsAt(t, rootfs)
		if viewMounts(t, rt.view)[rootfs] {
			t.Errorf("%s: %s is in the view", tc.name, rootfs)
		}
	}
}

// TestViewOnSharedHost runs the view's tests and the conformance suite
// through the view again where every mount is shared, as on a systemd host
// (this machine's are private): in a mount namespace of their own made by
// `unshare --propagation shared`.
func TestViewOnSharedHost(t *testing.T) {
	requireRunsc(t)
	if os.Getenv(sharedHostEnv) != "" {
		t.Skip("in the shared namespace already")
	}
	unshare, err := exec.LookPath("unshare")
	testsuite.Need(t, err == nil, "unshare (util-linux) not found")
	cmd := exec.Command(unshare, "--mount", "--propagation", "shared", os.Args[0], "-test.run", "^(TestView|TestSuiteInView)", "-test.count", "1", "-test.v")
	cmd.Env = append(os.Environ(), sharedHostEnv+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the view's tests on a shared host: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "--- PASS: TestViewFollowsHost") {
		t.Fatalf("TestViewFollowsHost did not pass on the shared host:\n%s", out)
	}
}

const sharedHostEnv = "FORKBOX_TEST_SHARED_HOST"
