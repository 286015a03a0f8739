// Fixtures: prerequisites, a busybox rootfs, a netns, a bundle built with
// runtime/spec, and checks of the host state a container leaves behind.

package testsuite

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

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/internal/runtime"
	"github.com/forkbox/forkbox/internal/runtime/spec"
)

// CgroupParent is the cgroup the suite's containers are created under.
const CgroupParent = "/forkbox-suite"

// Need skips tb (or, with CI=true, fails it) when a prerequisite is missing.
func Need(tb testing.TB, ok bool, why string) {
	tb.Helper()
	if ok {
		return
	}
	if os.Getenv("CI") == "true" {
		tb.Fatalf("prerequisite missing: %s", why)
	}
	tb.Skipf("prerequisite missing: %s", why)
}

// RequireRoot checks what every fixture needs: root, /bin/busybox, and the
// named runtime binary ("" = none) in PATH.
func RequireRoot(tb testing.TB, binary string) {
	tb.Helper()
	Need(tb, os.Geteuid() == 0, "must run as root")
	_, err := os.Stat("/bin/busybox")
	Need(tb, err == nil, "/bin/busybox (busybox-static) missing")
	if binary != "" {
		_, err = exec.LookPath(binary)
		Need(tb, err == nil, binary+" not in PATH")
	}
}

// RandID returns prefix followed by 8 random hex digits.
func RandID(prefix string) string {
	b := make([]byte, 4)
	rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// BusyboxRootfs builds dir/{bin/busybox + relative applet links, etc, tmp,
// proc, sys, dev, root}.
func BusyboxRootfs(tb testing.TB, dir string) {
	tb.Helper()
	for _, d := range []string{"bin", "etc", "tmp", "proc", "sys", "dev", "root"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			tb.Fatal(err)
		}
	}
	os.Chmod(filepath.Join(dir, "tmp"), 0o1777)
	b, err := os.ReadFile("/bin/busybox")
	if err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "bin/busybox"), b, 0o755); err != nil {
		tb.Fatal(err)
	}
	out, err := exec.Command("/bin/busybox", "--list").Output()
	if err != nil {
		tb.Fatal(err)
	}
	for _, app := range strings.Fields(string(out)) {
		if app != "busybox" {
			os.Symlink("busybox", filepath.Join(dir, "bin", app))
		}
	}
}

// Netns creates a named netns with lo up, deleted in Cleanup, and returns
// its path.
func Netns(tb testing.TB) string {
	tb.Helper()
	name := RandID("fbxsuite-")
	goruntime.LockOSThread()
	defer goruntime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		tb.Fatal(err)
	}
	defer orig.Close()
	ns, err := netns.NewNamed(name) // moves this thread into it
	if err != nil {
		tb.Fatal(err)
	}
	if err := netns.Set(orig); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { ns.Close(); netns.DeleteNamed(name) })
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		tb.Fatal(err)
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err != nil {
		tb.Fatal(err)
	}
	if err := h.LinkSetUp(lo); err != nil {
		tb.Fatal(err)
	}
	return filepath.Join("/run/netns", name)
}

// Fixture is one container's rootfs, netns and bundle.
type Fixture struct {
	RT       runtime.Runtime
	ID       string
	Bundle   string
	Rootfs   string
	Cgroup   string // cgroupsPath in the spec
	NetNS    string // netns path in the spec
	Hostname string
}

// NewFixture prepares a busybox rootfs, a netns and a bundle for one
// container of rt from so (Rootfs, Hostname, CgroupsPath, NetNSPath and the
// /etc mounts are filled in), applies hooks to the spec, and registers the
// cleanup of all of it, the container included.
func NewFixture(tb testing.TB, rt runtime.Runtime, so spec.SpecOptions, hooks ...func(*specs.Spec)) *Fixture {
	tb.Helper()
	tmp := tb.TempDir()
	f := &Fixture{RT: rt, ID: RandID("fbxsuite-"), Bundle: filepath.Join(tmp, "bundle"), Rootfs: filepath.Join(tmp, "rootfs")}
	f.Hostname = "host-" + f.ID[len(f.ID)-8:]
	BusyboxRootfs(tb, f.Rootfs)
	f.NetNS = Netns(tb)
	f.WriteBundle(tb, so, hooks...)
	return f
}

// WriteBundle writes f.Bundle for a container with f's id, rootfs (which
// must exist), hostname and netns from so (Rootfs, Hostname, CgroupsPath,
// NetNSPath and the /etc mounts are filled in; f.Cgroup is set under
// CgroupParent), applies hooks to the spec, and registers the container's
// deletion and its cgroup dirs' removal in Cleanup.
func (f *Fixture) WriteBundle(tb testing.TB, so spec.SpecOptions, hooks ...func(*specs.Spec)) {
	tb.Helper()
	f.Cgroup = CgroupParent + "/" + f.ID
	mounts, err := spec.WriteEtcFiles(f.Bundle, spec.EtcFiles{Hostname: f.Hostname})
	if err != nil {
		tb.Fatal(err)
	}
	so.Rootfs, so.Hostname, so.CgroupsPath, so.NetNSPath = f.Rootfs, f.Hostname, f.Cgroup, f.NetNS
	so.Mounts = append(so.Mounts, mounts...)
	if err := spec.PrepareRootfs(f.Rootfs); err != nil {
		tb.Fatal(err)
	}
	s, err := spec.NewSpec(so)
	if err != nil {
		tb.Fatal(err)
	}
	for _, h := range hooks {
		h(s)
	}
	if err := spec.WriteBundle(f.Bundle, s); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { f.remove(tb, f.ID) })
}

// remove force-deletes container id and its cgroup dirs.
func (f *Fixture) remove(tb testing.TB, id string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := f.RT.Delete(ctx, id, true); err != nil {
		tb.Errorf("cleanup: delete %s: %v", id, err)
	}
	for _, d := range CgroupDirs(CgroupParent + "/" + id) {
		os.Remove(d)
	}
	for _, d := range CgroupDirs(CgroupParent) {
		os.Remove(d) // only when empty: other tests may share it
	}
}

// WaitLog waits until the bundle's stdio log contains s and returns it.
func (f *Fixture) WaitLog(tb testing.TB, s string, timeout time.Duration) string {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for {
		b, _ := os.ReadFile(filepath.Join(f.Bundle, runtime.LogFileName))
		if strings.Contains(string(b), s) {
			return string(b)
		}
		if time.Now().After(deadline) {
			tb.Fatalf("%s has no %q after %v; it has %q", runtime.LogFileName, s, timeout, b)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// WaitFile waits until rootfs/name exists with non-empty content and
// returns it.
func (f *Fixture) WaitFile(tb testing.TB, name string, timeout time.Duration) string {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for {
		b, err := os.ReadFile(filepath.Join(f.Rootfs, name))
		if err == nil && len(b) > 0 {
			return string(b)
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(f.Bundle, runtime.LogFileName))
			tb.Fatalf("host rootfs has no %s after %v (%v); container log: %q", name, timeout, err, log)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// CgroupV2 reports whether /sys/fs/cgroup is a unified (v2) hierarchy.
func CgroupV2() bool {
	var st unix.Statfs_t
	return unix.Statfs("/sys/fs/cgroup", &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC
}

// CgroupDirs returns the existing host dirs of cgroup path p: one per v1
// hierarchy (and the hybrid v2 one), or the one v2 dir.
func CgroupDirs(p string) []string {
	if CgroupV2() {
		d := filepath.Join("/sys/fs/cgroup", p)
		if _, err := os.Stat(d); err == nil {
			return []string{d}
		}
		return nil
	}
	ds, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", p))
	return ds
}

// limitFiles maps the host cgroup files of path p to the values for a
// limit of 0.5 CPU, 64 MiB, 100 pids.
func limitFiles(p string) map[string]string {
	if CgroupV2() {
		d := filepath.Join("/sys/fs/cgroup", p)
		return map[string]string{
			d + "/memory.max": "67108864",
			d + "/cpu.max":    "50000 100000",
			d + "/pids.max":   "100",
		}
	}
	return map[string]string{
		filepath.Join("/sys/fs/cgroup/memory", p, "memory.limit_in_bytes"): "67108864",
		filepath.Join("/sys/fs/cgroup/cpu", p, "cpu.cfs_quota_us"):         "50000",
		filepath.Join("/sys/fs/cgroup/cpu", p, "cpu.cfs_period_us"):        "100000",
		filepath.Join("/sys/fs/cgroup/pids", p, "pids.max"):                "100",
	}
}
