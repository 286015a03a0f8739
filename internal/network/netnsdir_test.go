package network

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/internal/mount"
)

// sharedArea makes a directory that is a shared mount, as a systemd
// host's every mount is, and a peer of it (another namespace's copy, or a
// Kubernetes node's Bidirectional volume on the host, stands for it).
func sharedArea(t *testing.T) (area, peer string) {
	t.Helper()
	tmp := t.TempDir()
	area, peer = filepath.Join(tmp, "area"), filepath.Join(tmp, "peer")
	for _, d := range []string{area, peer} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := unix.Mount(area, area, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(area, unix.MNT_DETACH) })
	if err := unix.Mount("", area, "", unix.MS_SHARED, ""); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(area, peer, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(peer, unix.MNT_DETACH) })
	return area, peer
}

// bindNetns binds this thread's netns on a file at path, as Setup does.
func bindNetns(t *testing.T, path string) {
	t.Helper()
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("/proc/thread-self/ns/net", path, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(path, unix.MNT_DETACH) })
}

// mountsAt counts this namespace's mounts whose mount point is path.
func mountsAt(t *testing.T, path string) int {
	t.Helper()
	infos, err := mount.List()
	if err != nil {
		t.Fatal(err)
	}
	return mount.CountAt(infos, path)
}

// TestNetnsDirOwnPeerGroup: on a shared parent, the netns directory is a
// shared mount point of a peer group of its own: its netns files reach
// neither the parent's peers nor the parent itself (a second, shadowed
// mount of each there, and a copy in runsc's view, a slave of the host).
// Asked to join its parent (a Kubernetes node), they reach the parent's
// peers, as the host's side of a Bidirectional volume.
func TestNetnsDirOwnPeerGroup(t *testing.T) {
	requirePrivileges(t)
	for _, join := range []bool{false, true} {
		area, peer := sharedArea(t)
		dir := filepath.Join(area, "netns")
		if err := ensureNetnsDir(dir, !join); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { releaseNetnsDir(dir) })
		infos, err := mount.List()
		if err != nil {
			t.Fatal(err)
		}
		shared := false
		for _, in := range infos {
			if in.Mountpoint == dir {
				shared = in.Shared()
			}
		}
		if !shared {
			t.Errorf("join %v: %s is not a shared mount point", join, dir)
		}
		bindNetns(t, filepath.Join(dir, "sb-1"))
		inPeer := mountsAt(t, filepath.Join(peer, "netns", "sb-1"))
		onDir := mountsAt(t, filepath.Join(dir, "sb-1"))
		switch {
		case !join && (inPeer != 0 || onDir != 1):
			t.Errorf("own group: the netns file is mounted %d times in the parent's peer (want 0) and %d times on its path (want 1)", inPeer, onDir)
		case join && inPeer == 0:
			t.Error("joined: the netns file is not mounted in the parent's peer")
		}
	}
}

// An earlier version's netns directory, bound in its parent's peer group,
// moves to a group of its own when nothing is mounted in it, and stays
// where it is while netns files are (leaving would strand their copies on
// the parent, each holding its namespace).
func TestNetnsDirRegroupsEarlierOne(t *testing.T) {
	requirePrivileges(t)
	for _, busy := range []bool{false, true} {
		area, peer := sharedArea(t)
		dir := filepath.Join(area, "netns")
		if err := ensureNetnsDir(dir, false); err != nil { // as an earlier version made it
			t.Fatal(err)
		}
		t.Cleanup(func() { releaseNetnsDir(dir) })
		if busy {
			bindNetns(t, filepath.Join(dir, "sb-0"))
		}
		if err := ensureNetnsDir(dir, true); err != nil {
			t.Fatal(err)
		}
		infos, err := mount.List()
		if err != nil {
			t.Fatal(err)
		}
		in := mount.Top(infos, dir)
		if in == nil || !in.Shared() {
			t.Fatalf("busy %v: %s is %+v, want a shared mount point", busy, dir, in)
		}
		if got := mount.GroupShared(infos, *in); got != busy {
			t.Errorf("busy %v: %s shares its peer group: %v, want %v", busy, dir, got, busy)
		}
		bindNetns(t, filepath.Join(dir, "sb-1"))
		if n := mountsAt(t, filepath.Join(peer, "netns", "sb-1")); (n > 0) != busy {
			t.Errorf("busy %v: the netns file is mounted %d times in the parent's peer", busy, n)
		}
	}
}
