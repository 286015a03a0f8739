package runsc

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/internal/mount"
)

// viewMounts returns the mount points in the view.
func viewMounts(t *testing.T, v *view) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	err := v.do(func() error {
		infos, err := mount.List()
		for _, in := range infos {
			out[in.Mountpoint] = true
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func hostMounted(t *testing.T, path string) bool {
	t.Helper()
	mp, err := mount.IsMountPoint(path)
	if err != nil {
		t.Fatal(err)
	}
	return mp
}

// TestViewHidesSandboxMounts: the mounts below a hidden directory, made
// before the driver started or after, are not in runsc's view (the
// standbys' namespace) until attached for a command, and are gone from it
// after; the host keeps them throughout, and nothing attach does reaches
// the host.
func TestViewHidesSandboxMounts(t *testing.T) {
	requireRunsc(t)
	hide := filepath.Join(t.TempDir(), "sandboxes")
	before, after := filepath.Join(hide, "a", "rootfs"), filepath.Join(hide, "b", "rootfs")
	tmpfs := func(dir string) {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=1m"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	}
	// hide is a shared mount, as the netns directory is and as a systemd
	// host's every mount is: mounts made below it on the host propagate
	// into every copy of the host's namespace that is still its peer.
	if err := os.MkdirAll(hide, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(hide, hide, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(hide, unix.MNT_DETACH) })
	if err := unix.Mount("", hide, "", unix.MS_SHARED, ""); err != nil {
		t.Fatal(err)
	}
	tmpfs(before)
	rt := newRuntime(t, Options{Binary: standbyBinary(t), HideMountsUnder: []string{hide}, Standby: 1})
	v := rt.view
	if v == nil {
		t.Fatal("no view made")
	}
	tmpfs(after)
	if err := os.WriteFile(filepath.Join(after, "marker"), []byte("b's"), 0o600); err != nil {
		t.Fatal(err)
	}
	hostHad := hostMountsUnder(t, hide)

	in := viewMounts(t, v)
	for _, p := range []string{before, after} {
		if in[p] {
			t.Errorf("%s is mounted in the view before any attach", p)
		}
		if !hostMounted(t, p) {
			t.Errorf("%s is not mounted on the host", p)
		}
	}
	if !in["/proc"] {
		t.Error("the view lost the host's base mounts (/proc)")
	}

	release, err := v.attach([]string{after, after, filepath.Join(hide, "plain")})
	if err != nil {
		t.Fatal(err)
	}
	in = viewMounts(t, v)
	if !in[after] || in[before] {
		t.Errorf("after attach: %s mounted %v (want true), %s mounted %v (want false)", after, in[after], before, in[before])
	}
	var got []byte
	if err := v.do(func() (err error) { got, err = os.ReadFile(filepath.Join(after, "marker")); return err }); err != nil || string(got) != "b's" {
		t.Errorf("the view reads %q, %v from the attached mount; want the host's file", got, err)
	}
	// A second command on the same sandbox shares the attached mount.
	release2, err := v.attach([]string{after})
	if err != nil {
		t.Fatal(err)
	}
	release()
	if !viewMounts(t, v)[after] {
		t.Error("released by one command while another still holds it")
	}
	release2()
	if viewMounts(t, v)[after] {
		t.Error("still mounted in the view after the last release")
	}
	if !hostMounted(t, after) || hostMountsUnder(t, hide) != hostHad {
		t.Error("attach or release changed the host's mounts")
	}

	// The standby runsc waits in the view.
	var viewNS string
	if err := v.do(func() (err error) { viewNS, err = os.Readlink("/proc/thread-self/ns/mnt"); return err }); err != nil {
		t.Fatal(err)
	}
	host, _ := os.Readlink("/proc/thread-self/ns/mnt")
	if viewNS == host {
		t.Fatalf("the view is the host's namespace %s", host)
	}
	pid := awaitStandby(t, rt)
	ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", pid))
	if err != nil {
		t.Fatal(err)
	}
	if ns != viewNS {
		t.Errorf("the standby runsc waits in %s, not in the view %s", ns, viewNS)
	}

	// A command that ends after Close detaches nothing: its release must
	// not reach the host's mount at the same path.
	release3, err := v.attach([]string{after})
	if err != nil {
		t.Fatal(err)
	}
	if err := rt.Close(); err != nil {
		t.Fatal(err)
	}
	release3()
	if !hostMounted(t, after) {
		t.Error("a release after Close unmounted the host's mount")
	}
	// hide was a mount point before the driver (as the netns directory
	// is, the network's): Close leaves it, though nothing is below it.
	unix.Unmount(before, 0)
	unix.Unmount(after, 0)
	if !hostMounted(t, hide) {
		t.Errorf("Close unmounted %s, a mount point it did not make", hide)
	}
}

// hostMountsUnder lists the host's mount points below dir (this
// goroutine's thread is the host's), in order.
func hostMountsUnder(t *testing.T, dir string) string {
	t.Helper()
	under, err := mount.Under(dir)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(under, "\n")
}

// The view leaves out the host's mounts no runsc of the driver needs (an
// overlay and a namespace file outside its directories: another daemon's
// sandbox), so it does not keep them busy once the host unmounts them,
// and keeps those in its own directories.
func TestViewDropsOthersMounts(t *testing.T) {
	requireRunsc(t)
	tmp := t.TempDir()
	other, own := filepath.Join(tmp, "other"), filepath.Join(tmp, "own")
	overlay := func(dir string) string {
		for _, d := range []string{"lower", "upper", "work", "merged"} {
			if err := os.MkdirAll(filepath.Join(dir, d), 0o700); err != nil {
				t.Fatal(err)
			}
		}
		m := filepath.Join(dir, "merged")
		opts := "lowerdir=" + filepath.Join(dir, "lower") + ",upperdir=" + filepath.Join(dir, "upper") + ",workdir=" + filepath.Join(dir, "work")
		if err := unix.Mount("overlay", m, "overlay", 0, opts); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Unmount(m, unix.MNT_DETACH) })
		return m
	}
	otherRoot, ownRoot := overlay(other), overlay(own)
	netns := filepath.Join(other, "netns")
	if err := os.WriteFile(netns, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("/proc/self/ns/net", netns, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(netns, unix.MNT_DETACH) })

	rt := newRuntime(t, Options{HideMountsUnder: []string{filepath.Join(tmp, "hidden")}, KeepMountsUnder: []string{own}})
	if rt.view == nil {
		t.Fatal("no view made")
	}
	in := viewMounts(t, rt.view)
	for _, p := range []string{otherRoot, netns} {
		if in[p] {
			t.Errorf("the view keeps %s, which no runsc of the driver needs", p)
		}
	}
	if !in[ownRoot] {
		t.Errorf("the view dropped %s, in a directory it was told to keep", ownRoot)
	}
}

// However many runsc commands run in the view, at once, no thread but
// their own ends up in it: not the goroutines that asked, and not the main
// thread, which /proc/self names (the threads are ocicli.OnOtherThread's,
// whose main-thread rule crun's TestLockedOffMainSparesTheMainThread shows).
func TestViewLeavesOtherThreads(t *testing.T) {
	requireRunsc(t)
	rt := newRuntime(t, Options{HideMountsUnder: []string{filepath.Join(t.TempDir(), "hidden")}})
	if rt.view == nil {
		t.Fatal("no view made")
	}
	host, err := os.Readlink("/proc/thread-self/ns/mnt")
	if err != nil {
		t.Fatal(err)
	}
	var in string
	if err := rt.view.do(func() (err error) { in, err = os.Readlink("/proc/thread-self/ns/mnt"); return err }); err != nil {
		t.Fatal(err)
	}
	if in == host {
		t.Fatalf("do ran in the host's namespace %s, not the view", host)
	}
	const n = 16
	errs := make(chan error, n)
	for range n {
		go func() {
			_, err := rt.command(context.Background(), "", "list")
			if err == nil {
				if ns, _ := os.Readlink("/proc/thread-self/ns/mnt"); ns != host {
					err = fmt.Errorf("the asking goroutine's thread is in %s after runsc ran, not the host's %s", ns, host)
				}
			}
			errs <- err
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	if got, _ := os.Readlink("/proc/self/ns/mnt"); got != host {
		t.Errorf("the main thread is in %s after runsc ran in the view, want the host's %s", got, host)
	}
}
