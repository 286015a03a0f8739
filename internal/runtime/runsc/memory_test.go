// Memory-fork tests: a counter process in a source sandbox continues in two
// containers restored from one checkpoint image (each with its own copy of
// the rootfs at another host path, in its own netns), the children
// diverge, and the source itself is restored from the same image.

package runsc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/runtime/spec"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// mfScript serves "hello" on TCP 8080 and counts in a shell variable: each
// tick rewrites /root/counter (a fresh open), appends to /root/held.log
// through a descriptor held open across the checkpoint, and prints the
// tick, the hostname and /root/role to stdout.
const mfScript = `(while true; do echo hello | nc -l -p 8080; done) &
exec 3>>/root/held.log; i=0
while true; do
  i=$((i+1)); echo $i >&3; echo $i > /root/counter
  echo "tick=$i host=$(hostname) role=$(cat /root/role 2>/dev/null)"
  sleep 0.05
done`

func TestMemoryFork(t *testing.T) {
	requireRunsc(t)
	tmp := t.TempDir()
	rt, err := New(Options{Root: filepath.Join(tmp, "state"), LogDir: filepath.Join(tmp, "logs")})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	lower := filepath.Join(tmp, "lower")
	busyboxRootfs(t, lower)
	args := []string{"/bin/sh", "-c", mfScript}

	// Source: an overlay of the image over its own upper, in a netns
	// whose eth0 is 10.231.20.2.
	srcUpper := filepath.Join(tmp, "src", "upper")
	src := mfBundle(t, rt, filepath.Join(tmp, "src"), mfOverlay(t, lower, filepath.Join(tmp, "src")), "fbx-src", testNetns(t), args)
	srcPeer := mfVeth(t, src.netns, "10.231.20.2/24", "10.231.20.1/24")
	if err := rt.Run(ctx, src.id, src.bundle); err != nil {
		t.Fatalf("run: %v", err)
	}
	waitLog(t, src.bundle, "tick=10 ", 20*time.Second)
	if got := mfDial(t, srcPeer, "10.231.20.2:8080"); got != "hello\n" {
		t.Fatalf("source: read %q, want hello", got)
	}

	img := filepath.Join(tmp, "image")
	t0 := time.Now()
	if err := rt.Checkpoint(ctx, src.id, img); err != nil {
		t.Fatalf("checkpoint: %v", err)
	}
	t.Logf("checkpoint: %v", time.Since(t0))
	if err := rt.Checkpoint(ctx, src.id, img); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("checkpoint into a used image dir: got %v, want AlreadyExists", err)
	}
	n := lastInt(filepath.Join(src.bundle, "stdio.log"))
	time.Sleep(200 * time.Millisecond)
	if m := lastInt(filepath.Join(src.bundle, "stdio.log")); m != n {
		t.Fatalf("source still counting after checkpoint: %d → %d", n, m)
	}
	if c := lastInt(filepath.Join(srcUpper, "root/counter")); c != n {
		t.Errorf("source upper root/counter = %d at checkpoint, stdout says %d", c, n)
	}

	// Two children, each with a copy of the source's upper (the test's
	// stand-in for a btrfs snapshot) mounted over the same lower at
	// another path, a hostname of its own and a netns with another IP.
	type kid struct {
		*mfBox
		upper string
		peer  netns.NsHandle
		ip    string
	}
	var kids []kid
	for i := 0; i < 2; i++ {
		dir := filepath.Join(tmp, fmt.Sprintf("kid%d", i))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		copyTree(t, srcUpper, filepath.Join(dir, "upper"))
		k := kid{upper: filepath.Join(dir, "upper"), ip: fmt.Sprintf("10.231.%d.2", 21+i)}
		k.mfBox = mfBundle(t, rt, dir, mfOverlay(t, lower, dir), fmt.Sprintf("fbx-kid%d", i), testNetns(t), args)
		k.peer = mfVeth(t, k.netns, k.ip+"/24", fmt.Sprintf("10.231.%d.1/24", 21+i))
		t0 := time.Now()
		if err := rt.Restore(ctx, k.id, k.bundle, img); err != nil {
			t.Fatalf("restore kid%d: %v", i, err)
		}
		t.Logf("restore kid%d: %v", i, time.Since(t0))
		kids = append(kids, k)
	}
	if err := rt.Restore(ctx, kids[0].id, kids[0].bundle, img); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("restore onto a live id: got %v, want AlreadyExists", err)
	}
	// The source takes its own place again: same id, bundle and rootfs.
	if err := rt.Delete(ctx, src.id, true); err != nil {
		t.Fatal(err)
	}
	t0 = time.Now()
	if err := rt.Restore(ctx, src.id, src.bundle, img); err != nil {
		t.Fatalf("restore source: %v", err)
	}
	t.Logf("restore source: %v", time.Since(t0))

	// Diverge: each child gets its own role, written inside it.
	for i, k := range kids {
		mfExec(t, rt, k.id, "sh", "-c", fmt.Sprintf("echo r%d > /root/role", i))
	}
	want := n + 20
	all := append([]*mfBox{src}, kids[0].mfBox, kids[1].mfBox)
	for _, b := range all {
		waitLog(t, b.bundle, fmt.Sprintf("tick=%d ", want), 20*time.Second)
	}
	for i, b := range all {
		log, _ := os.ReadFile(filepath.Join(b.bundle, "stdio.log"))
		role := ""
		upper := srcUpper
		if i > 0 {
			role = fmt.Sprintf("r%d", i-1)
			upper = kids[i-1].upper
			// A child's log starts where the source stopped.
			if first := firstTick(string(log)); first != n+1 {
				t.Errorf("%s: first tick %d, want %d (source stopped at %d)", b.hostname, first, n+1, n)
			}
			if got := mfDial(t, kids[i-1].peer, kids[i-1].ip+":8080"); got != "hello\n" {
				t.Errorf("%s: read %q from %s, want hello", b.hostname, got, kids[i-1].ip)
			}
		}
		last := lastLine(string(log))
		if wantSuffix := fmt.Sprintf("host=%s role=%s", b.hostname, role); !strings.HasSuffix(last, wantSuffix) {
			t.Errorf("%s: last line %q, want suffix %q", b.hostname, last, wantSuffix)
		}
		// The writes (fresh opens and the held descriptor) go to this
		// container's own upper.
		c, h := lastInt(filepath.Join(upper, "root/counter")), lastInt(filepath.Join(upper, "root/held.log"))
		if c < want || h < want {
			t.Errorf("%s: upper counter=%d held=%d, want ≥ %d", b.hostname, c, h, want)
		}
		if i > 0 {
			r, _ := os.ReadFile(filepath.Join(upper, "root/role"))
			if strings.TrimSpace(string(r)) != role {
				t.Errorf("%s: upper root/role = %q, want %q", b.hostname, r, role)
			}
		}
	}
	if _, err := os.Stat(filepath.Join(srcUpper, "root/role")); err == nil {
		t.Errorf("a child's write reached the source's upper")
	}
}

// mfOverlay mounts lower + dir/upper (created empty if missing) at
// dir/rootfs and unmounts it in Cleanup.
func mfOverlay(t *testing.T, lower, dir string) string {
	t.Helper()
	upper, work, target := filepath.Join(dir, "upper"), filepath.Join(dir, "work"), filepath.Join(dir, "rootfs")
	for _, d := range []string{upper, work, target} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", lower, upper, work)
	if err := unix.Mount("overlay", target, "overlay", 0, opts); err != nil {
		t.Fatalf("mount overlay %s: %v", target, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(target, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", target, err)
		}
	})
	return target
}

// mfExec runs args in container id with `runsc exec`.
func mfExec(t *testing.T, rt *Runsc, id string, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := rt.command(ctx, "", append([]string{"exec", id}, args...)...); err != nil {
		t.Fatalf("exec in %s: %v", id, err)
	}
}

func firstTick(log string) int {
	for _, l := range strings.Split(log, "\n") {
		if f := strings.Fields(l); len(f) > 0 {
			if n, err := strconv.Atoi(strings.TrimPrefix(f[0], "tick=")); err == nil {
				return n
			}
		}
	}
	return 0
}

func lastLine(log string) string {
	lines := strings.Split(strings.TrimSpace(log), "\n")
	return lines[len(lines)-1]
}

// mfBox is one container of a memory-fork test: its own bundle dir (etc
// files, config.json, stdio.log) beside a rootfs dir.
type mfBox struct {
	id, bundle, rootfs, netns, hostname string
}

// mfBundle writes a bundle for rootfs (which must exist) with args, the
// given hostname and netns, and registers the container's deletion.
func mfBundle(t *testing.T, rt *Runsc, dir, rootfs, hostname, netnsPath string, args []string) *mfBox {
	t.Helper()
	b := &mfBox{id: randID("fbxmf-"), bundle: filepath.Join(dir, "bundle"), rootfs: rootfs, netns: netnsPath, hostname: hostname}
	mounts, err := spec.WriteEtcFiles(b.bundle, spec.EtcFiles{Hostname: hostname})
	if err != nil {
		t.Fatal(err)
	}
	if err := spec.PrepareRootfs(rootfs); err != nil {
		t.Fatal(err)
	}
	s, err := spec.NewSpec(spec.SpecOptions{
		Rootfs: rootfs, Hostname: hostname, Args: args, NetNSPath: netnsPath,
		CgroupsPath: "/forkbox-test/" + b.id, Mounts: mounts,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := spec.WriteBundle(b.bundle, s); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mfDelete(t, rt, b.id) })
	return b
}

func mfDelete(t *testing.T, rt *Runsc, id string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := rt.Delete(ctx, id, true); err != nil {
		t.Errorf("cleanup delete %s: %v", id, err)
	}
	for _, c := range cgroupControllers {
		os.Remove(filepath.Join("/sys/fs/cgroup", c, "forkbox-test", id))
		os.Remove(filepath.Join("/sys/fs/cgroup", c, "forkbox-test"))
	}
}

// copyTree copies src to dst with cp -a (the test's stand-in for a btrfs
// snapshot of the source's upper).
func copyTree(t *testing.T, src, dst string) {
	t.Helper()
	if out, err := exec.Command("cp", "-a", src, dst).CombinedOutput(); err != nil {
		t.Fatalf("cp -a %s %s: %v: %s", src, dst, err, out)
	}
}

// lastInt returns the last integer (or tick=N word) in path (0 if none).
func lastInt(path string) int {
	b, _ := os.ReadFile(path)
	words := strings.Fields(string(b))
	for i := len(words) - 1; i >= 0; i-- {
		if n, err := strconv.Atoi(strings.TrimPrefix(words[i], "tick=")); err == nil {
			return n
		}
	}
	return 0
}

// mfVeth puts eth0 (sbAddr) in the netns at sbPath and its peer (peerAddr)
// in a new peer netns, returned as a handle.
func mfVeth(t *testing.T, sbPath, sbAddr, peerAddr string) netns.NsHandle {
	t.Helper()
	peer := testNetns(t)
	sbNS, err := netns.GetFromPath(sbPath)
	if err != nil {
		t.Fatal(err)
	}
	defer sbNS.Close()
	peerNS, err := netns.GetFromPath(peer)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { peerNS.Close() })
	hs, _ := netlink.NewHandleAt(sbNS)
	defer hs.Close()
	if err := hs.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0"}, PeerName: "peer0", PeerNamespace: netlink.NsFd(peerNS)}); err != nil {
		t.Fatal(err)
	}
	hp, _ := netlink.NewHandleAt(peerNS)
	defer hp.Close()
	for _, c := range []struct {
		h          *netlink.Handle
		name, addr string
	}{{hs, "eth0", sbAddr}, {hp, "peer0", peerAddr}} {
		l, err := c.h.LinkByName(c.name)
		if err != nil {
			t.Fatal(err)
		}
		a, _ := netlink.ParseAddr(c.addr)
		if err := c.h.AddrAdd(l, a); err != nil {
			t.Fatal(err)
		}
		if err := c.h.LinkSetUp(l); err != nil {
			t.Fatal(err)
		}
	}
	return peerNS
}

// mfDial connects to addr from ns (retrying for 10 s) and returns what the
// server sends.
func mfDial(t *testing.T, ns netns.NsHandle, addr string) string {
	t.Helper()
	s, err := tryDial(ns, addr, 10*time.Second)
	if err != nil {
		t.Errorf("dial %s: %v", addr, err)
	}
	return s
}

func tryDial(ns netns.NsHandle, addr string, timeout time.Duration) (string, error) {
	type result struct {
		s   string
		err error
	}
	ch := make(chan result, 1)
	go func() {
		goruntime.LockOSThread()
		if err := netns.Set(ns); err != nil {
			ch <- result{err: err}
			return
		}
		deadline := time.Now().Add(timeout)
		for {
			c, err := net.DialTimeout("tcp", addr, 500*time.Millisecond)
			if err == nil {
				c.SetDeadline(time.Now().Add(2 * time.Second))
				b, err := io.ReadAll(c)
				c.Close()
				if err == nil && len(b) > 0 {
					ch <- result{s: string(b)}
					return
				}
			}
			if time.Now().After(deadline) {
				ch <- result{err: err}
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
	r := <-ch
	return r.s, r.err
}
