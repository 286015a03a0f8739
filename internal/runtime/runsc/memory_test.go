// Memory-fork tests: a counter process in a source sandbox continues in two
// containers restored from one checkpoint image (each with its own copy of
// the rootfs at another host path, in its own netns), the children
// diverge, and the source itself is restored from the same image.

package runsc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/runtime/spec"
	"github.com/forkbox/forkbox/internal/runtime/testsuite"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// mfScript serves "hello" on TCP 8080 and counts in a shell variable: each
// tick rewrites /root/counter (a fresh open of a new file, renamed over it:
// the host reads a whole value, never the moment between a truncation and
// the write, which made a child's counter read 0), appends to /root/held.log
// through a descriptor held open across the checkpoint, and prints the
// tick, the hostname and /root/role to stdout.
const mfScript = `(while true; do echo hello | nc -l -p 8080; done) &
exec 3>>/root/held.log; i=0
while true; do
  i=$((i+1)); echo $i >&3; echo $i > /root/counter.new; mv /root/counter.new /root/counter
  echo "tick=$i host=$(hostname) role=$(cat /root/role 2>/dev/null)"
  sleep 0.05
done`

func TestMemoryFork(t *testing.T) {
	g := newMFRig(t)
	rt, tmp, lower, args := g.rt, g.tmp, g.lower, g.args
	ctx := context.Background()

	// Source: an overlay of the image over its own upper, in a netns
	// whose eth0 is 10.231.20.2.
	srcUpper := filepath.Join(tmp, "src", "upper")
	src := mfBundle(t, rt, filepath.Join(tmp, "src"), mfOverlay(t, lower, filepath.Join(tmp, "src")), "fbx-src", testsuite.Netns(t), args)
	srcPeer := veth(t, src.NetNS, "10.231.20.2/24", "10.231.20.1/24")
	if err := rt.Run(ctx, src.ID, src.Bundle); err != nil {
		t.Fatalf("run: %v", err)
	}
	src.WaitLog(t, "tick=10 ", 60*time.Second)
	if got := mfDial(t, srcPeer, "10.231.20.2:8080"); got != "hello\n" {
		t.Fatalf("source: read %q, want hello", got)
	}

	img := filepath.Join(tmp, "image")
	t0 := time.Now()
	if err := rt.Checkpoint(ctx, src.ID, img); err != nil {
		t.Fatalf("checkpoint: %v", err)
	}
	t.Logf("checkpoint: %v", time.Since(t0))
	if err := rt.Checkpoint(ctx, src.ID, img); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("checkpoint into a used image dir: got %v, want AlreadyExists", err)
	}
	n := lastInt(filepath.Join(src.Bundle, "stdio.log"))
	time.Sleep(200 * time.Millisecond)
	if m := lastInt(filepath.Join(src.Bundle, "stdio.log")); m != n {
		t.Fatalf("source still counting after checkpoint: %d → %d", n, m)
	}
	// The script writes the counter file, then stdout: the checkpoint may
	// fall between the two.
	if c := lastInt(filepath.Join(srcUpper, "root/counter")); c != n && c != n+1 {
		t.Errorf("source upper root/counter = %d at checkpoint, stdout says %d", c, n)
	}

	// Two children, each with a copy of the source's upper (the test's
	// stand-in for a btrfs snapshot) mounted over the same lower at
	// another path, a hostname of its own and a netns with another IP.
	type kid struct {
		*testsuite.Fixture
		upper string
		peer  netns.NsHandle
		ip    string
	}
	var kids []kid
	for i := 0; i < 2; i++ {
		dir := g.childDir(t, filepath.Dir(srcUpper), fmt.Sprintf("kid%d", i))
		k := kid{upper: filepath.Join(dir, "upper"), ip: fmt.Sprintf("10.231.%d.2", 21+i)}
		k.Fixture = mfBundle(t, rt, dir, mfOverlay(t, lower, dir), fmt.Sprintf("fbx-kid%d", i), testsuite.Netns(t), args)
		k.peer = veth(t, k.NetNS, k.ip+"/24", fmt.Sprintf("10.231.%d.1/24", 21+i))
		t0 := time.Now()
		if err := rt.Restore(ctx, k.ID, k.Bundle, img); err != nil {
			t.Fatalf("restore kid%d: %v", i, err)
		}
		t.Logf("restore kid%d: %v", i, time.Since(t0))
		kids = append(kids, k)
	}
	if err := rt.Restore(ctx, kids[0].ID, kids[0].Bundle, img); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("restore onto a live id: got %v, want AlreadyExists", err)
	}
	// The source takes its own place again: same id, bundle and rootfs.
	if err := rt.Delete(ctx, src.ID, true); err != nil {
		t.Fatal(err)
	}
	t0 = time.Now()
	if err := rt.Restore(ctx, src.ID, src.Bundle, img); err != nil {
		t.Fatalf("restore source: %v", err)
	}
	t.Logf("restore source: %v", time.Since(t0))

	// Diverge: each child gets its own role, written inside it.
	for i, k := range kids {
		mfExec(t, rt, k.ID, "sh", "-c", fmt.Sprintf("echo r%d > /root/role", i))
	}
	want := n + 20
	all := []*testsuite.Fixture{src, kids[0].Fixture, kids[1].Fixture}
	for _, b := range all {
		b.WaitLog(t, fmt.Sprintf("tick=%d ", want), 60*time.Second)
	}
	for i, b := range all {
		log, _ := os.ReadFile(filepath.Join(b.Bundle, "stdio.log"))
		role := ""
		upper := srcUpper
		if i > 0 {
			role = fmt.Sprintf("r%d", i-1)
			upper = kids[i-1].upper
			// A child's log starts where the source stopped.
			if first := firstTick(string(log)); first != n+1 {
				t.Errorf("%s: first tick %d, want %d (source stopped at %d)", b.Hostname, first, n+1, n)
			}
			if got := mfDial(t, kids[i-1].peer, kids[i-1].ip+":8080"); got != "hello\n" {
				t.Errorf("%s: read %q from %s, want hello", b.Hostname, got, kids[i-1].ip)
			}
		}
		last := lastLine(string(log))
		if wantSuffix := fmt.Sprintf("host=%s role=%s", b.Hostname, role); !strings.HasSuffix(last, wantSuffix) {
			t.Errorf("%s: last line %q, want suffix %q", b.Hostname, last, wantSuffix)
		}
		// The writes (fresh opens and the held descriptor) go to this
		// container's own upper.
		c, h := lastInt(filepath.Join(upper, "root/counter")), lastInt(filepath.Join(upper, "root/held.log"))
		if c < want || h < want {
			t.Errorf("%s: upper counter=%d held=%d, want ≥ %d", b.Hostname, c, h, want)
		}
		if i > 0 {
			r, _ := os.ReadFile(filepath.Join(upper, "root/role"))
			if strings.TrimSpace(string(r)) != role {
				t.Errorf("%s: upper root/role = %q, want %q", b.Hostname, r, role)
			}
		}
	}
	if _, err := os.Stat(filepath.Join(srcUpper, "root/role")); err == nil {
		t.Errorf("a child's write reached the source's upper")
	}
}

// mfRig is what the memory tests start from: a runtime with its state in
// a temp dir, and a busybox lower layer.
type mfRig struct {
	rt         *Runsc
	tmp, lower string
	args       []string // mfScript's
}

func newMFRig(t *testing.T) *mfRig {
	t.Helper()
	requireRunsc(t)
	tmp := t.TempDir()
	rt, err := New(Options{Root: filepath.Join(tmp, "state"), LogDir: filepath.Join(tmp, "logs")})
	if err != nil {
		t.Fatal(err)
	}
	g := &mfRig{rt: rt, tmp: tmp, lower: filepath.Join(tmp, "lower"), args: []string{"/bin/sh", "-c", mfScript}}
	testsuite.BusyboxRootfs(t, g.lower)
	return g
}

// source runs mfScript over its own upper in tmp/src, in a netns of its
// own, until it has ticked 3 times; it returns the dir and the container.
func (g *mfRig) source(t *testing.T, hostname string) (string, *testsuite.Fixture) {
	t.Helper()
	dir := filepath.Join(g.tmp, "src")
	src := mfBundle(t, g.rt, dir, mfOverlay(t, g.lower, dir), hostname, testsuite.Netns(t), g.args)
	if err := g.rt.Run(context.Background(), src.ID, src.Bundle); err != nil {
		t.Fatalf("run: %v", err)
	}
	src.WaitLog(t, "tick=3 ", 60*time.Second)
	return dir, src
}

// childDir makes tmp/name holding a copy of srcDir's upper (a child's
// writable layer, as the source's was when copied).
func (g *mfRig) childDir(t *testing.T, srcDir, name string) string {
	t.Helper()
	dir := filepath.Join(g.tmp, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	copyTree(t, filepath.Join(srcDir, "upper"), filepath.Join(dir, "upper"))
	return dir
}

// memoryChild pauses and checkpoints src (run from srcDir) and restores the
// image as a new sandbox with its own copy of src's writable layer,
// hostname and netns.
func (g *mfRig) memoryChild(t *testing.T, src *testsuite.Fixture, srcDir, hostname string, args []string) *testsuite.Fixture {
	t.Helper()
	ctx := context.Background()
	img := filepath.Join(g.tmp, "image-"+hostname)
	if err := g.rt.Pause(ctx, src.ID); err != nil {
		t.Fatal(err)
	}
	if err := g.rt.CheckpointLive(ctx, src.ID, img); err != nil {
		t.Fatalf("checkpoint: %v", err)
	}
	kidDir := g.childDir(t, srcDir, hostname)
	kid := mfBundle(t, g.rt, kidDir, mfOverlay(t, g.lower, kidDir), hostname, testsuite.Netns(t), args)
	if err := g.rt.Restore(ctx, kid.ID, kid.Bundle, img); err != nil {
		t.Fatalf("restore: %v", err)
	}
	return kid
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
	if _, err := rt.command(ctx, id, append([]string{"exec", id}, args...)...); err != nil {
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

// mfBundle writes a bundle in dir/bundle for rootfs (which must exist)
// with args, the given hostname and netns, and registers the container's
// deletion.
func mfBundle(t *testing.T, rt *Runsc, dir, rootfs, hostname, netnsPath string, args []string) *testsuite.Fixture {
	t.Helper()
	f := &testsuite.Fixture{RT: rt, ID: testsuite.RandID("fbxmf-"), Bundle: filepath.Join(dir, "bundle"), Rootfs: rootfs, NetNS: netnsPath, Hostname: hostname}
	f.WriteBundle(t, spec.SpecOptions{Args: args})
	return f
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

// mfDial connects to addr from ns (retrying for 30 s) and returns what the
// server sends.
func mfDial(t *testing.T, ns netns.NsHandle, addr string) string {
	t.Helper()
	s, err := tryDial(ns, addr, 30*time.Second)
	if err != nil {
		t.Errorf("dial %s: %v", addr, err)
	}
	return s
}
