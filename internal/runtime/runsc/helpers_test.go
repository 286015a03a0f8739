// Test helpers: prerequisites, a busybox rootfs, a netns, bundles, and
// checks for host state left behind by a sandbox.

package runsc

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"testing"
	"time"

	"github.com/forkbox/forkbox/internal/runtime/spec"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// need skips (or, with CI=true, fails) when a prerequisite is missing.
func need(t *testing.T, ok bool, why string) {
	t.Helper()
	if ok {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("prerequisite missing: %s", why)
	}
	t.Skipf("prerequisite missing: %s", why)
}

func requireRunsc(t *testing.T) {
	t.Helper()
	need(t, os.Geteuid() == 0, "must run as root")
	_, err := exec.LookPath("runsc")
	need(t, err == nil, "runsc not in PATH")
	_, err = os.Stat("/bin/busybox")
	need(t, err == nil, "/bin/busybox (busybox-static) missing")
	_, err = os.Stat("/sys/fs/cgroup/memory")
	need(t, err == nil, "cgroup v1 memory controller not mounted")
}

func randID(prefix string) string {
	b := make([]byte, 4)
	rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// busyboxRootfs builds DIR/{bin/busybox + relative applet links, etc, tmp,
// proc, sys, dev}.
func busyboxRootfs(t *testing.T, dir string) {
	t.Helper()
	for _, d := range []string{"bin", "etc", "tmp", "proc", "sys", "dev", "root"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	os.Chmod(filepath.Join(dir, "tmp"), 0o1777)
	b, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "bin/busybox"), b, 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("/bin/busybox", "--list").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, app := range strings.Fields(string(out)) {
		if app == "busybox" {
			continue
		}
		os.Symlink("busybox", filepath.Join(dir, "bin", app))
	}
}

// testNetns creates a named netns with lo up, deleted in Cleanup. It returns
// its path.
func testNetns(t *testing.T) string {
	t.Helper()
	name := randID("fbxtest-")
	goruntime.LockOSThread()
	defer goruntime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer orig.Close()
	ns, err := netns.NewNamed(name) // unshares this thread into it
	if err != nil {
		t.Fatal(err)
	}
	if err := netns.Set(orig); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close(); netns.DeleteNamed(name) })
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	if err := h.LinkSetUp(lo); err != nil {
		t.Fatal(err)
	}
	return filepath.Join("/run/netns", name)
}

type fixture struct {
	rt     *Runsc
	id     string
	bundle string
	rootfs string
	cgroup string // cgroupsPath in the spec
	netns  string // netns path in the spec
}

// newFixture prepares a rootfs, netns, bundle and driver for one container
// and registers the cleanup of all of it.
func newFixture(t *testing.T, o Options, so spec.SpecOptions) *fixture {
	t.Helper()
	requireRunsc(t)
	tmp := t.TempDir()
	f := &fixture{id: randID("fbxtest-"), bundle: filepath.Join(tmp, "bundle"), rootfs: filepath.Join(tmp, "rootfs")}
	busyboxRootfs(t, f.rootfs)
	f.cgroup = "/forkbox-test/" + f.id
	if o.Root == "" {
		o.Root = filepath.Join(tmp, "state")
	}
	if o.LogDir == "" {
		o.LogDir = filepath.Join(tmp, "logs")
	}
	rt, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	f.rt = rt
	mounts, err := spec.WriteEtcFiles(f.bundle, spec.EtcFiles{Hostname: f.id, Nameservers: []string{"127.0.0.53"}})
	if err != nil {
		t.Fatal(err)
	}
	so.Rootfs, so.Hostname, so.CgroupsPath = f.rootfs, f.id, f.cgroup
	f.netns = testNetns(t)
	so.NetNSPath = f.netns
	if err := spec.PrepareRootfs(f.rootfs); err != nil {
		t.Fatal(err)
	}
	so.Mounts = append(so.Mounts, mounts...)
	s, err := spec.NewSpec(so)
	if err != nil {
		t.Fatal(err)
	}
	if err := spec.WriteBundle(f.bundle, s); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := rt.Delete(ctx, f.id, true); err != nil {
			t.Errorf("cleanup delete: %v", err)
		}
		for _, c := range cgroupControllers {
			os.Remove(filepath.Join("/sys/fs/cgroup", c, f.cgroup))
			os.Remove(filepath.Join("/sys/fs/cgroup", c, "forkbox-test"))
		}
	})
	return f
}

var cgroupControllers = []string{"memory", "cpu", "pids", "cpuacct", "cpuset", "freezer", "blkio", "devices", "systemd", "unified"}

// hostProcsWith returns the host pids whose cmdline mentions s.
func hostProcsWith(s string) []string {
	var pids []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if e.Name()[0] < '0' || e.Name()[0] > '9' {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(b), s) {
			pids = append(pids, e.Name()+":"+strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
	return pids
}

// waitLog waits until the bundle's stdio log contains s and returns it.
func waitLog(t *testing.T, bundle, s string, timeout time.Duration) string {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		b, _ := os.ReadFile(filepath.Join(bundle, "stdio.log"))
		if strings.Contains(string(b), s) {
			return string(b)
		}
		if time.Now().After(deadline) {
			t.Fatalf("stdio.log has no %q after %v; it has %q", s, timeout, b)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
