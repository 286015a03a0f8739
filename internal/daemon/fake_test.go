package daemon

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/agent"
	"github.com/forkbox/forkbox/internal/image"
	"github.com/forkbox/forkbox/internal/mount"
	"github.com/forkbox/forkbox/internal/network"
	"github.com/forkbox/forkbox/internal/runtime"
	"github.com/forkbox/forkbox/internal/runtime/runsc"
	"github.com/forkbox/forkbox/internal/runtime/spec"
	"github.com/forkbox/forkbox/internal/snapshot"
	"github.com/forkbox/forkbox/internal/snapshot/naive"
	"github.com/forkbox/forkbox/internal/testimage"
)

// The fake host: a runtime whose "containers" are in-process agent servers
// on loopback, a network that only allocates addresses, mounts that are only
// recorded, and a freezer that is a map. With the naive snapshotter and the
// real store and image store, the daemon's engine logic runs without root.

// world is the fake host's state, shared by its parts.
type world struct {
	t   testing.TB
	mu  sync.Mutex
	ctr map[string]*container // by sandbox ID
	// mounts and frozen are keyed by target dir and cgroup path.
	mounts map[string][]mount.Mount
	frozen map[string]bool
	// cpu is every CPU quota (µs per spec.CPUPeriod) each cgroup was
	// given, in order: from the spec when a container makes it (as the OCI
	// runtime does), and by the daemon. ceiling is what CPUCeiling says.
	cpu     map[string][]int64
	ceiling float64
	// noCPULimitPatch: the fake runsc does not take the CPU limit
	// annotation; quotaErr fails SetCPUQuota.
	noCPULimitPatch bool
	// noMemoryLimitPatch: the fake runsc does not enforce the memory
	// limit annotation (a stock runsc).
	noMemoryLimitPatch bool
	quotaErr           error
	netns              map[string]netip.Addr
	egress             map[string]network.Policy // by sandbox id, as set up or set
	// detached are the sandboxes whose bridge port is given back.
	detached map[string]bool
	// dying containers are reported running once more, then stopped (a
	// killed sandbox whose processes are not reaped yet).
	dying map[string]bool
	// Faults to inject.
	checkpointErr   error // Checkpoint fails; the container keeps running unless checkpointStops
	checkpointStops bool
	restoreErr      error
	restoreStarts   bool  // a failing Restore started the container first (its agent then never answered)
	attachErr       error // Attach fails (a full bridge), leaving the sandbox detached
	frozenErr       error
	// moveErr fails the next Pause or Resume after (moveTakes) or instead
	// of making its move, as a runsc CLI killed after or before it saved
	// its state file does.
	moveErr   error
	moveTakes bool
	// silentOp, when set, gives containers started from now on a hostile
	// agent that never answers that operation (hostileagent_test.go).
	silentOp string
}

// container is one fake container: an agent server while it runs.
type container struct {
	status string
	token  string
	addr   string
	stop   func()
}

func newWorld(t testing.TB) *world {
	w := &world{t: t, ctr: map[string]*container{}, mounts: map[string][]mount.Mount{}, frozen: map[string]bool{}, cpu: map[string][]int64{}, ceiling: math.Inf(1), netns: map[string]netip.Addr{}, egress: map[string]network.Policy{}, detached: map[string]bool{},
		dying: map[string]bool{}}
	t.Cleanup(w.close)
	return w
}

func (w *world) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, c := range w.ctr {
		c.halt()
	}
}

// serveAgent starts an in-process agent with token on a loopback port.
func (w *world) serveAgent(c *container) error {
	if w.silentOp != "" {
		a := serveSilentAgent(w.t, w.silentOp)
		c.addr, c.status = a.addr, runtime.StatusRunning
		c.stop = func() {} // it ends with the test
		return nil
	}
	srv, err := agent.NewServer(agent.Config{Token: c.token, LogDir: w.t.TempDir(), Env: []string{"PATH=/usr/bin:/bin"},
		ForkHooks: []string{}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.Serve(ctx, ln)
	}()
	c.addr, c.status = ln.Addr().String(), runtime.StatusRunning
	c.stop = func() { cancel(); <-done }
	return nil
}

// halt stops a container's agent; the caller holds w.mu.
func (c *container) halt() {
	if c.stop != nil {
		c.stop()
		c.stop = nil
	}
}

// silence stops a container's agent but leaves the runtime reporting it
// running (a hung or slow agent).
func (w *world) silence(id string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.ctr[id].halt()
}

// revive starts a silenced container's agent again.
func (w *world) revive(id string) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.serveAgent(w.ctr[id])
}

// kill stops a container's agent; the runtime reports it running once
// more, then stopped.
func (w *world) kill(id string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.dying[id] = true
}

// crash makes a container gone, as if its processes died with the daemon.
func (w *world) crash(id string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.ctr[id].halt()
	delete(w.ctr, id)
}

func (w *world) status(id string) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if c, ok := w.ctr[id]; ok {
		return c.status
	}
	return ""
}

// hostOps.

func (w *world) MountAll(_ context.Context, m []mount.Mount, target string) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.mounts[target] = m
	return nil
}

// mountsAt returns what is mounted at target (nil: nothing).
func (w *world) mountsAt(target string) []mount.Mount {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.mounts[target]
}

func (w *world) Unmount(_ context.Context, target string) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.mounts, target)
	return nil
}

func (w *world) Freeze(_ context.Context, cg string) error { return w.setFrozen(cg, true) }
func (w *world) Thaw(_ context.Context, cg string) error   { return w.setFrozen(cg, false) }

func (w *world) setFrozen(cg string, v bool) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.frozen[cg] = v
	return nil
}

func (w *world) SetCPUQuota(cg string, quota int64, period uint64) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, ok := w.cpu[cg]; !ok {
		return fmt.Errorf("cgroup %s: %w", cg, errdefs.ErrNotFound)
	}
	if w.quotaErr != nil {
		return w.quotaErr
	}
	if period != spec.CPUPeriod {
		return fmt.Errorf("cgroup %s: period %d: %w", cg, period, errdefs.ErrFailedPrecondition)
	}
	w.cpu[cg] = append(w.cpu[cg], quota)
	return nil
}

func (w *world) CPUCeiling(string) float64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.ceiling
}

// cpuOf returns the CPU quotas a cgroup was given, in order (0: none).
func (w *world) cpuOf(cg string) []int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.cpu[cg])
}

// cgroupFrom records the CPU quota of the cgroup bundle's spec names, as
// the OCI runtime sets it when it makes the cgroup.
func (w *world) cgroupFrom(bundle string) error {
	s, err := spec.ReadBundle(bundle)
	if err != nil {
		return err
	}
	if s.Linux == nil || s.Linux.CgroupsPath == "" {
		return nil
	}
	var q int64
	if r := s.Linux.Resources; r != nil && r.CPU != nil && r.CPU.Quota != nil {
		q = *r.CPU.Quota
	}
	// As cpu-limit.patch: a named limit is a positive quota no larger than
	// the spec's (and the daemon names one only above it).
	if v, ok := s.Annotations[runsc.AnnotationCPULimit]; ok {
		l, err := strconv.ParseInt(v, 10, 64)
		if err != nil || l <= 0 || l >= q {
			return fmt.Errorf("fake runsc: %s=%q with a quota of %d", runsc.AnnotationCPULimit, v, q)
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.cpu[s.Linux.CgroupsPath] = append(w.cpu[s.Linux.CgroupsPath], q)
	return nil
}

func (w *world) Frozen(cg string) (bool, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.frozen[cg], w.frozenErr
}

func (w *world) AgentAddr(id string, _ netip.Addr) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if c, ok := w.ctr[id]; ok && c.stop != nil {
		return c.addr
	}
	return "127.0.0.1:1" // nothing listens
}

// fakeNet allocates addresses and records namespaces; it sets up nothing.
type fakeNet struct{ w *world }

func (n fakeNet) AllocateFunc(last netip.Addr, taken network.Taken) (netip.Addr, error) {
	for i := 2; i < 255; i++ {
		a := netip.AddrFrom4([4]byte{10, 201, 0, byte(i)})
		t, err := taken(a)
		if err != nil {
			return netip.Addr{}, err
		}
		if !t && a != last {
			return a, nil
		}
	}
	return netip.Addr{}, fmt.Errorf("fake subnet full: %w", errdefs.ErrResourceExhausted)
}

func (n fakeNet) Setup(_ context.Context, id string, ip netip.Addr, pol network.Policy) (*network.Network, error) {
	n.w.mu.Lock()
	defer n.w.mu.Unlock()
	n.w.netns[id] = ip
	n.w.egress[id] = pol
	return &network.Network{ID: id, NSPath: "/nonexistent/netns/" + id, IP: ip, Gateway: netip.MustParseAddr("10.201.0.1"), PrefixLen: 24, Egress: pol.Mode, Policy: pol}, nil
}

func (n fakeNet) SetPolicy(_ context.Context, id string, ip netip.Addr, pol network.Policy) error {
	n.w.mu.Lock()
	defer n.w.mu.Unlock()
	if n.w.netns[id] != ip {
		return fmt.Errorf("netns of %s at %s: %w", id, ip, errdefs.ErrNotFound)
	}
	n.w.egress[id] = pol
	return nil
}

func (n fakeNet) policy(id string) network.Policy {
	n.w.mu.Lock()
	defer n.w.mu.Unlock()
	return n.w.egress[id]
}

func (n fakeNet) Reconfigure(_ context.Context, id string, ip netip.Addr) error {
	n.w.mu.Lock()
	defer n.w.mu.Unlock()
	if _, ok := n.w.netns[id]; !ok {
		return fmt.Errorf("netns of %s: %w", id, errdefs.ErrNotFound)
	}
	n.w.netns[id] = ip
	return nil
}

func (n fakeNet) Teardown(_ context.Context, id string) error {
	n.w.mu.Lock()
	defer n.w.mu.Unlock()
	delete(n.w.netns, id)
	delete(n.w.egress, id)
	delete(n.w.detached, id)
	return nil
}

func (n fakeNet) Detach(_ context.Context, id string, ip netip.Addr) error {
	n.w.mu.Lock()
	defer n.w.mu.Unlock()
	if n.w.netns[id] != ip {
		return fmt.Errorf("netns of %s at %s: %w", id, ip, errdefs.ErrNotFound)
	}
	n.w.detached[id] = true
	return nil
}

// KeepPlace: the fake's netns records are not files a reboot removes.
func (fakeNet) KeepPlace(string) error { return nil }

func (n fakeNet) Attach(_ context.Context, id string, ip netip.Addr, _ network.Egress) error {
	n.w.mu.Lock()
	defer n.w.mu.Unlock()
	if n.w.netns[id] != ip {
		return fmt.Errorf("netns of %s at %s: %w", id, ip, errdefs.ErrNotFound)
	}
	n.w.detached[id] = true
	if n.w.attachErr != nil {
		return n.w.attachErr
	}
	delete(n.w.detached, id)
	return nil
}

// isDetached reports whether sandbox id's bridge port is given back.
func (w *world) isDetached(id string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.detached[id]
}

func (n fakeNet) List(context.Context) ([]string, error) {
	n.w.mu.Lock()
	defer n.w.mu.Unlock()
	var ids []string
	for id := range n.w.netns {
		ids = append(ids, id)
	}
	return ids, nil
}

func (n fakeNet) Destroy(context.Context) error { return nil }

func (n fakeNet) Counters(_ context.Context, id string) (network.Counters, error) {
	return network.Counters{}, fmt.Errorf("fake network: no veth for %s: %w", id, errdefs.ErrNotFound)
}

// fakeRuntime runs containers as in-process agents. memRuntime adds memory
// checkpoints (as gVisor has).
type fakeRuntime struct {
	w    *world
	name string
}

type memRuntime struct{ fakeRuntime }

var (
	_ runtime.Runtime            = fakeRuntime{}
	_ runtime.MemoryCheckpointer = memRuntime{}
)

func (r fakeRuntime) Name() string { return r.name }

func (r fakeRuntime) Run(_ context.Context, id, bundle string) error {
	s, err := spec.ReadBundle(bundle)
	if err != nil {
		return err
	}
	token := ""
	for _, kv := range s.Process.Env {
		if v, ok := strings.CutPrefix(kv, agent.EnvToken+"="); ok {
			token = v
			break // the agent takes the first (Go's os.Getenv)
		}
	}
	if err := r.w.cgroupFrom(bundle); err != nil {
		return err
	}
	return r.start(id, token)
}

func (r fakeRuntime) start(id, token string) error {
	r.w.mu.Lock()
	defer r.w.mu.Unlock()
	if _, ok := r.w.ctr[id]; ok {
		return fmt.Errorf("container %s: %w", id, errdefs.ErrAlreadyExists)
	}
	c := &container{token: token}
	if err := r.w.serveAgent(c); err != nil {
		return err
	}
	r.w.ctr[id] = c
	return nil
}

func (r fakeRuntime) State(_ context.Context, id string) (runtime.State, error) {
	r.w.mu.Lock()
	defer r.w.mu.Unlock()
	c, ok := r.w.ctr[id]
	if !ok {
		return runtime.State{}, fmt.Errorf("container %s: %w", id, errdefs.ErrNotFound)
	}
	st := runtime.State{ID: id, Status: c.status}
	if r.w.dying[id] {
		delete(r.w.dying, id)
		c.halt()
		c.status = runtime.StatusStopped
	}
	return st, nil
}

func (r fakeRuntime) Kill(_ context.Context, id string, _ syscall.Signal, _ bool) error {
	r.w.mu.Lock()
	defer r.w.mu.Unlock()
	c, ok := r.w.ctr[id]
	if !ok {
		return fmt.Errorf("container %s: %w", id, errdefs.ErrNotFound)
	}
	c.halt()
	c.status = runtime.StatusStopped
	return nil
}

func (r fakeRuntime) Delete(_ context.Context, id string, _ bool) error {
	r.w.mu.Lock()
	defer r.w.mu.Unlock()
	if c, ok := r.w.ctr[id]; ok {
		c.halt()
		delete(r.w.ctr, id)
	}
	return nil
}

func (r fakeRuntime) List(context.Context) ([]runtime.State, error) {
	r.w.mu.Lock()
	defer r.w.mu.Unlock()
	var out []runtime.State
	for id, c := range r.w.ctr {
		out = append(out, runtime.State{ID: id, Status: c.status})
	}
	return out, nil
}

// Pause and Resume move a container between running and paused, and refuse
// any other move, as runsc does (the daemon pauses gVisor through them).
func (r fakeRuntime) Pause(_ context.Context, id string) error {
	return r.w.move(id, runtime.StatusRunning, runtime.StatusPaused)
}

func (r fakeRuntime) Resume(_ context.Context, id string) error {
	return r.w.move(id, runtime.StatusPaused, runtime.StatusRunning)
}

func (w *world) move(id, from, to string) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	c, ok := w.ctr[id]
	if !ok {
		return fmt.Errorf("container %s: %w", id, errdefs.ErrNotFound)
	}
	if c.status != from {
		return fmt.Errorf("container %s is %s, not %s: %w", id, c.status, from, errdefs.ErrFailedPrecondition)
	}
	if err := w.moveErr; err != nil {
		w.moveErr = nil
		if w.moveTakes {
			c.status = to
		}
		return err
	}
	c.status = to
	return nil
}

const fakeTokenFile = "token"

// Checkpoint writes the agent's token as the "memory image" and stops the
// container (as runsc does once the image is complete).
func (r memRuntime) Checkpoint(_ context.Context, id, imageDir string) error {
	r.w.mu.Lock()
	defer r.w.mu.Unlock()
	c, ok := r.w.ctr[id]
	if !ok {
		return fmt.Errorf("container %s: %w", id, errdefs.ErrNotFound)
	}
	if r.w.checkpointErr != nil {
		if r.w.checkpointStops {
			c.halt()
			c.status = runtime.StatusStopped
		}
		return r.w.checkpointErr
	}
	if err := os.MkdirAll(imageDir, 0o700); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(imageDir, fakeTokenFile), []byte(c.token), 0o600); err != nil {
		return err
	}
	c.halt()
	c.status = runtime.StatusStopped
	return nil
}

// EnforcesMemoryLimit: the fake runsc is built with memory-limit.patch
// unless the world says not.
func (r memRuntime) EnforcesMemoryLimit(context.Context) bool {
	r.w.mu.Lock()
	defer r.w.mu.Unlock()
	return !r.w.noMemoryLimitPatch
}

// ShowsCPULimit: the fake runsc takes the CPU limit annotation unless
// the world says not.
func (r memRuntime) ShowsCPULimit(context.Context) bool {
	r.w.mu.Lock()
	defer r.w.mu.Unlock()
	return !r.w.noCPULimitPatch
}

// Restore starts the container's agent with the token of the image: the
// processes continue as they were.
func (r memRuntime) Restore(_ context.Context, id, bundle string, imageDir string) error {
	tok, err := os.ReadFile(filepath.Join(imageDir, fakeTokenFile))
	if err != nil {
		return fmt.Errorf("fake restore: %w", err)
	}
	if err := r.w.cgroupFrom(bundle); err != nil {
		return err
	}
	if err := r.w.restoreErr; err != nil {
		if r.w.restoreStarts {
			return errors.Join(err, r.start(id, string(tok)))
		}
		return err
	}
	return r.start(id, string(tok))
}

// harness is a daemon on the fake host.
type harness struct {
	t   *testing.T
	d   *Daemon
	w   *world
	cfg Config
	img image.Image
}

// newHarness opens a daemon on a fresh state dir with the fake host, the
// naive snapshotter and one small image, "unit:1".
func newHarness(t *testing.T) *harness {
	t.Helper()
	dir := t.TempDir()
	agentBin := filepath.Join(dir, "forkbox-agent")
	if err := os.WriteFile(agentBin, nil, 0o755); err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, w: newWorld(t), cfg: Config{StateDir: filepath.Join(dir, "state"), RunDir: filepath.Join(dir, "run"),
		AgentPath: agentBin, DefaultRuntime: RuntimeGVisor, Snapshotter: "copy", CgroupParent: "forkbox-unit-" + randomHex(4),
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))}}
	t.Cleanup(func() {
		if h.d != nil {
			h.d.Close()
		}
	})
	h.reopen(h.runtimes(RuntimeGVisor, RuntimeCrun))
	h.img = h.importImage("unit:1")
	return h
}

// runtimes returns fake runtimes under these names (gvisor can checkpoint
// memory, crun cannot).
func (h *harness) runtimes(names ...string) map[string]runtime.Runtime {
	m := map[string]runtime.Runtime{}
	for _, n := range names {
		if n == RuntimeGVisor {
			m[n] = memRuntime{fakeRuntime{w: h.w, name: n}}
		} else {
			m[n] = fakeRuntime{w: h.w, name: n}
		}
	}
	return m
}

// reopen closes the daemon (if open) and opens it again on the same state
// and fake host, as a daemon restart does: reconcile runs.
func (h *harness) reopen(rts map[string]runtime.Runtime) {
	h.t.Helper()
	if _, err := h.openWith(rts, nil, nil); err != nil {
		h.t.Fatal(err)
	}
}

// openWith closes the daemon (if open) and opens it again on the same
// state and fake host with runtimes rts, the snapshotter wrapped by wrap
// (nil: as it is) and the network nw (nil: the fake one). It returns the
// unwrapped snapshotter and open's error (h.d is nil then).
func (h *harness) openWith(rts map[string]runtime.Runtime, wrap func(snapshot.Snapshotter) snapshot.Snapshotter, nw netManager) (snapshot.Snapshotter, error) {
	h.t.Helper()
	if h.d != nil {
		if err := h.d.Close(); err != nil {
			h.t.Fatal(err)
		}
		h.d = nil
	}
	ctx := context.Background()
	snaps, err := naive.Open(ctx, filepath.Join(h.cfg.StateDir, "snapshots"), h.cfg.Log)
	if err != nil {
		h.t.Fatal(err)
	}
	var ps snapshot.Snapshotter = snaps
	if wrap != nil {
		ps = wrap(snaps)
	}
	if nw == nil {
		nw = fakeNet{h.w}
	}
	h.d, err = open(ctx, h.cfg, parts{snaps: ps, net: nw, runtimes: rts, host: h.w})
	return snaps, err
}

// importImage imports a one-layer image owned by the test's user (so that
// unpacking needs no root).
func (h *harness) importImage(ref string) image.Image {
	h.t.Helper()
	return h.importImageEnv(ref, nil)
}

// importImageEnv is importImage with env as the image's configured
// environment.
func (h *harness) importImageEnv(ref string, env []string) image.Image {
	h.t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	uid, gid := os.Getuid(), os.Getgid()
	for _, e := range []struct {
		name, body string
		dir        bool
	}{{name: "etc/", dir: true}, {name: "etc/os-release", body: "ID=unit\n"}, {name: "root/", dir: true}} {
		hdr := &tar.Header{Name: e.name, Mode: 0o644, Uid: uid, Gid: gid, Typeflag: tar.TypeReg, Size: int64(len(e.body))}
		if e.dir {
			hdr.Mode, hdr.Typeflag, hdr.Size = 0o755, tar.TypeDir, 0
		}
		if err := tw.WriteHeader(hdr); err != nil {
			h.t.Fatal(err)
		}
		tw.Write([]byte(e.body))
	}
	tw.Close()
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf.Bytes())), nil })
	if err != nil {
		h.t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		h.t.Fatal(err)
	}
	if env != nil {
		if img, err = mutate.Config(img, v1.Config{Env: env}); err != nil {
			h.t.Fatal(err)
		}
	}
	path := filepath.Join(h.t.TempDir(), "img.tar")
	if err := testimage.WriteOCIArchive(img, ref, path); err != nil {
		h.t.Fatal(err)
	}
	got, err := h.d.images.Import(context.Background(), path, "", nil)
	if err != nil {
		h.t.Fatal(err)
	}
	return got
}

// upper returns the directory of a sandbox's writable layer, as the
// snapshotter describes its mount.
func (h *harness) upper(id string) string {
	h.t.Helper()
	ms, err := h.d.snaps.Mounts(context.Background(), id, h.img.Layers)
	if err != nil {
		h.t.Fatal(err)
	}
	for _, m := range ms {
		for _, o := range m.Options {
			if v, ok := strings.CutPrefix(o, "upperdir="); ok {
				return v
			}
		}
		if m.Type == "bind" {
			return m.Source
		}
	}
	h.t.Fatalf("no upper dir in %+v", ms)
	return ""
}

// create creates a sandbox or fails the test.
func (h *harness) create(o CreateOptions) string {
	h.t.Helper()
	if o.Image == "" {
		o.Image = "unit:1"
	}
	sb, err := h.d.Create(context.Background(), o)
	if err != nil {
		h.t.Fatalf("create: %v", err)
	}
	return sb.ID
}

// events returns the types of a sandbox's ledger events.
func (h *harness) events(id string) []string {
	h.t.Helper()
	evs, err := h.d.store.Events(context.Background(), id)
	if err != nil {
		h.t.Fatal(err)
	}
	var out []string
	for _, e := range evs {
		out = append(out, e.Type)
	}
	return out
}

// liveCount is how many sandboxes are not closed.
func (h *harness) liveCount() int {
	h.t.Helper()
	live, err := h.d.store.ListSandboxes(context.Background(), false)
	if err != nil {
		h.t.Fatal(err)
	}
	return len(live)
}

var errInjected = errors.New("injected fault")
