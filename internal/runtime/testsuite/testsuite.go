// Package testsuite is the conformance suite every runtime.Runtime
// implementation runs (runsc, crun), with its fixtures: a busybox rootfs, a
// netns and a bundle built with runtime/spec. It checks the rules of the
// runtime.Runtime doc comment against the real binary and the host's
// kernel state (processes, cgroups, namespaces, the rootfs dir), and holds
// the start benchmarks of bench.go.
package testsuite

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/hostproc"
	"github.com/forkbox/forkbox/internal/runtime"
	"github.com/forkbox/forkbox/internal/runtime/spec"
)

// Option adjusts the suite to an implementation.
type Option func(*config)

type config struct {
	hooks []func(*specs.Spec)
}

// WithSpec applies hook to every spec the suite writes (crun: Harden).
func WithSpec(hook func(*specs.Spec)) Option {
	return func(c *config) { c.hooks = append(c.hooks, hook) }
}

func newConfig(opts []Option) *config {
	c := &config{}
	for _, o := range opts {
		o(c)
	}
	return c
}

// NewRuntime returns the runtime under test. It should skip (or fail with
// CI=true) when its binary is missing, and use a state root of its own in
// t.TempDir.
type NewRuntime func(t *testing.T) runtime.Runtime

// Run runs every case of the suite against the runtimes newRuntime returns
// (one per case).
func Run(t *testing.T, newRuntime NewRuntime, opts ...Option) {
	c := newConfig(opts)
	for _, tc := range []struct {
		name string
		fn   func(*testing.T, runtime.Runtime, *config)
	}{
		{"Lifecycle", testLifecycle},
		{"UnknownID", testUnknownID},
		{"RunFailureLeavesNothing", testRunFailure},
		{"RunFailureSaysWhy", testRunFailureSaysWhy},
		{"Limits", testLimits},
		{"Isolation", testIsolation},
		{"PauseResume", testPauseResume},
		{"WritesReachRootfs", testWrites},
		{"Concurrent", testConcurrent},
	} {
		t.Run(tc.name, func(t *testing.T) {
			RequireRoot(t, "")
			tc.fn(t, newRuntime(t), c)
		})
	}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func sleeper(script string) spec.SpecOptions {
	return spec.SpecOptions{Args: []string{"/bin/sh", "-c", script + "; exec sleep 1000"}}
}

func mustRun(t *testing.T, f *Fixture) runtime.State {
	t.Helper()
	ctx := ctxT(t)
	if err := f.RT.Run(ctx, f.ID, f.Bundle); err != nil {
		t.Fatalf("run: %v", err)
	}
	st, err := f.RT.State(ctx, f.ID)
	if err != nil {
		t.Fatalf("state: %v", err)
	}
	if st.Status != runtime.StatusRunning || st.Pid <= 0 || st.ID != f.ID {
		t.Fatalf("state = %+v, want %s running with pid > 0", st, f.ID)
	}
	return st
}

func testLifecycle(t *testing.T, rt runtime.Runtime, c *config) {
	f := NewFixture(t, rt, sleeper("echo started"), c.hooks...)
	ctx := ctxT(t)
	st := mustRun(t, f)
	f.WaitLog(t, "started", 10*time.Second)
	if err := rt.Run(ctx, f.ID, f.Bundle); !errdefs.IsAlreadyExists(err) {
		t.Errorf("second run: got %v, want AlreadyExists", err)
	}
	list, err := rt.List(ctx)
	if err != nil {
		t.Fatalf("list: %v", err)
	}
	if !slices.ContainsFunc(list, func(s runtime.State) bool { return s.ID == f.ID && s.Status == runtime.StatusRunning }) {
		t.Errorf("list = %+v, want %s running in it", list, f.ID)
	}
	if err := rt.Delete(ctx, f.ID, false); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("delete of a running container without force: got %v, want FailedPrecondition", err)
	}
	if err := rt.Kill(ctx, f.ID, syscall.SIGKILL, true); err != nil {
		t.Fatalf("kill: %v", err)
	}
	if err := rt.Delete(ctx, f.ID, true); err != nil {
		t.Fatalf("delete: %v", err)
	}
	if _, err := rt.State(ctx, f.ID); !errdefs.IsNotFound(err) {
		t.Errorf("state after delete: got %v, want NotFound", err)
	}
	if err := rt.Delete(ctx, f.ID, false); err != nil {
		t.Errorf("second delete: got %v, want nil", err)
	}
	if err := rt.Kill(ctx, f.ID, syscall.SIGTERM, false); !errdefs.IsNotFound(err) {
		t.Errorf("kill after delete: got %v, want NotFound", err)
	}
	assertGone(t, f, st.Pid)
}

// assertGone checks that no process, cgroup dir or List entry of f's
// container is left on the host.
func assertGone(t *testing.T, f *Fixture, pid int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for pid > 0 && !hostproc.Exited(pid) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond) // the init may take a moment to be reaped
	}
	if pid > 0 && !hostproc.Exited(pid) {
		t.Errorf("container init (host pid %d) still runs after delete", pid)
	}
	if ds := CgroupDirs(f.Cgroup); len(ds) > 0 {
		t.Errorf("cgroup dirs left after delete: %q", ds)
	}
	list, err := f.RT.List(context.Background())
	if err != nil {
		t.Errorf("list: %v", err)
	}
	if slices.ContainsFunc(list, func(s runtime.State) bool { return s.ID == f.ID }) {
		t.Errorf("list after delete = %+v, still has %s", list, f.ID)
	}
}

func testUnknownID(t *testing.T, rt runtime.Runtime, _ *config) {
	ctx := ctxT(t)
	const id = "fbxsuite-none"
	if _, err := rt.State(ctx, id); !errdefs.IsNotFound(err) {
		t.Errorf("state: got %v, want NotFound", err)
	}
	if err := rt.Kill(ctx, id, syscall.SIGKILL, false); !errdefs.IsNotFound(err) {
		t.Errorf("kill: got %v, want NotFound", err)
	}
	if err := rt.Pause(ctx, id); !errdefs.IsNotFound(err) {
		t.Errorf("pause: got %v, want NotFound", err)
	}
	if err := rt.Resume(ctx, id); !errdefs.IsNotFound(err) {
		t.Errorf("resume: got %v, want NotFound", err)
	}
	if err := rt.Delete(ctx, id, false); err != nil {
		t.Errorf("delete: got %v, want nil", err)
	}
	if err := rt.Delete(ctx, id, true); err != nil {
		t.Errorf("delete --force: got %v, want nil", err)
	}
	for _, bad := range []string{"../x", "", "a/b"} {
		if _, err := rt.State(ctx, bad); !errdefs.IsInvalidArgument(err) {
			t.Errorf("state %q: got %v, want InvalidArgument", bad, err)
		}
	}
	if err := rt.Run(ctx, "fbxsuite-nobundle", "relative/bundle"); !errdefs.IsInvalidArgument(err) {
		t.Errorf("run with a relative bundle: got %v, want InvalidArgument", err)
	}
	if l, err := rt.List(ctx); err != nil || len(l) != 0 {
		t.Errorf("list = %v, %v; want empty", l, err)
	}
}

func testRunFailure(t *testing.T, rt runtime.Runtime, c *config) {
	f := NewFixture(t, rt, spec.SpecOptions{Args: []string{"/no/such/binary"}}, c.hooks...)
	err := rt.Run(ctxT(t), f.ID, f.Bundle)
	if err == nil {
		t.Fatal("run of a missing binary succeeded")
	}
	t.Logf("run error: %v", err)
	if _, err := rt.State(ctxT(t), f.ID); !errdefs.IsNotFound(err) {
		t.Errorf("state after failed run: got %v, want NotFound", err)
	}
	assertGone(t, f, 0)
}

// testRunFailureSaysWhy: a container that cannot start for a bind mount
// whose source is gone fails the run naming that source (under gVisor the
// sandbox dies as it starts, and only its runsc log says why), of the
// class of a spec naming what is not there, and leaves nothing.
func testRunFailureSaysWhy(t *testing.T, rt runtime.Runtime, c *config) {
	gone := filepath.Join(t.TempDir(), "gone")
	f := NewFixture(t, rt, spec.SpecOptions{Args: []string{"true"},
		Mounts: []specs.Mount{{Destination: "/data", Type: "bind", Source: gone, Options: []string{"rbind"}}}}, c.hooks...)
	err := rt.Run(ctxT(t), f.ID, f.Bundle)
	if err == nil {
		t.Fatal("run with a bind of a missing source succeeded")
	}
	t.Logf("run error: %v", err)
	if !strings.Contains(err.Error(), gone) {
		t.Errorf("run error %q does not name the missing source", err)
	}
	if !errdefs.IsInvalidArgument(err) {
		t.Errorf("run error class: %v, want InvalidArgument", err)
	}
	if _, err := rt.State(ctxT(t), f.ID); !errdefs.IsNotFound(err) {
		t.Errorf("state after failed run: got %v, want NotFound", err)
	}
	assertGone(t, f, 0)
}

func testLimits(t *testing.T, rt runtime.Runtime, c *config) {
	so := sleeper("true")
	so.CPU, so.MemoryBytes, so.Pids = 0.5, 64<<20, 100
	f := NewFixture(t, rt, so, c.hooks...)
	mustRun(t, f)
	for file, want := range limitFiles(f.Cgroup) {
		b, err := os.ReadFile(file)
		if got := strings.TrimSpace(string(b)); err != nil || got != want {
			t.Errorf("%s = %q, %v; want %q", file, got, err, want)
		}
	}
}

func testIsolation(t *testing.T, rt runtime.Runtime, c *config) {
	f := NewFixture(t, rt, sleeper("echo pid=$$ host=$(hostname) end"), c.hooks...)
	st := mustRun(t, f)
	log := f.WaitLog(t, " end", 10*time.Second)
	if want := fmt.Sprintf("pid=1 host=%s end", f.Hostname); !strings.Contains(log, want) {
		t.Errorf("init printed %q, want %q", log, want)
	}
	var ns syscall.Stat_t
	if err := syscall.Stat(f.NetNS, &ns); err != nil {
		t.Fatal(err)
	}
	link, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", st.Pid))
	if want := fmt.Sprintf("net:[%d]", ns.Ino); err != nil || link != want {
		t.Errorf("container pid %d netns = %q, %v; want %s (the spec's %s)", st.Pid, link, err, want, f.NetNS)
	}
	self, _ := os.Readlink("/proc/self/ns/pid")
	if got, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", st.Pid)); got == self {
		t.Errorf("container pid %d shares the host's pid namespace %s", st.Pid, got)
	}
}

func testPauseResume(t *testing.T, rt runtime.Runtime, c *config) {
	f := NewFixture(t, rt, sleeper("true"), c.hooks...)
	ctx := ctxT(t)
	mustRun(t, f)
	status := func() string {
		st, err := rt.State(ctx, f.ID)
		if err != nil {
			t.Fatalf("state: %v", err)
		}
		return st.Status
	}
	if err := rt.Resume(ctx, f.ID); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("resume of a running container: got %v, want FailedPrecondition", err)
	}
	t0 := time.Now()
	if err := rt.Pause(ctx, f.ID); err != nil {
		t.Fatalf("pause: %v", err)
	}
	t.Logf("pause: %v", time.Since(t0))
	if s := status(); s != runtime.StatusPaused {
		t.Errorf("after pause: status %q, want paused", s)
	}
	if err := rt.Pause(ctx, f.ID); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("pause of a paused container: got %v, want FailedPrecondition", err)
	}
	t0 = time.Now()
	if err := rt.Resume(ctx, f.ID); err != nil {
		t.Fatalf("resume: %v", err)
	}
	t.Logf("resume: %v", time.Since(t0))
	if s := status(); s != runtime.StatusRunning {
		t.Errorf("after resume: status %q, want running", s)
	}
	// A paused container can be force-deleted.
	if err := rt.Pause(ctx, f.ID); err != nil {
		t.Fatalf("pause: %v", err)
	}
	st, _ := rt.State(ctx, f.ID)
	if err := rt.Delete(ctx, f.ID, true); err != nil {
		t.Fatalf("delete of a paused container: %v", err)
	}
	assertGone(t, f, st.Pid)
}

func testWrites(t *testing.T, rt runtime.Runtime, c *config) {
	f := NewFixture(t, rt, sleeper("echo hi > /x; echo tmp > /tmp/y"), c.hooks...)
	mustRun(t, f)
	if got := f.WaitFile(t, "x", 10*time.Second); got != "hi\n" {
		t.Errorf("host rootfs x = %q, want %q", got, "hi\n")
	}
	if got := f.WaitFile(t, "tmp/y", 10*time.Second); got != "tmp\n" {
		t.Errorf("host rootfs tmp/y = %q, want %q", got, "tmp\n")
	}
}

// RunOOM checks that the kernel's OOM killer works inside the container: a
// process that outgrows the memory limit is killed (exit 137) while the
// init survives. Only for runtimes whose processes are host processes in the
// container's cgroup (crun): gVisor has no OOM killer inside the sandbox,
// and at the host limit the whole sandbox dies (forkbox's agent enforces the
// limit there instead).
func RunOOM(t *testing.T, newRuntime NewRuntime, opts ...Option) {
	c := newConfig(opts)
	RequireRoot(t, "")
	rt := newRuntime(t)
	so := spec.SpecOptions{
		Args:        []string{"/bin/sh", "-c", "dd if=/dev/zero of=/dev/null bs=300M count=1; echo rc=$? > /result; exec sleep 1000"},
		MemoryBytes: 64 << 20,
	}
	f := NewFixture(t, rt, so, c.hooks...)
	mustRun(t, f)
	if got := strings.TrimSpace(f.WaitFile(t, "result", 30*time.Second)); got != "rc=137" {
		t.Errorf("dd over the limit: %q, want rc=137 (SIGKILL by the OOM killer)", got)
	}
	st, err := rt.State(ctxT(t), f.ID)
	if err != nil || st.Status != runtime.StatusRunning {
		t.Errorf("after the OOM kill: state %+v, %v; want running", st, err)
	}
}

// testConcurrent runs, checks and deletes several containers at once.
func testConcurrent(t *testing.T, rt runtime.Runtime, c *config) {
	const n = 4
	fs := make([]*Fixture, n)
	for i := range fs {
		fs[i] = NewFixture(t, rt, sleeper("true"), c.hooks...)
	}
	ctx := ctxT(t)
	each := func(op func(f *Fixture) error) []error {
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i, f := range fs {
			wg.Add(1)
			go func() { defer wg.Done(); errs[i] = op(f) }()
		}
		wg.Wait()
		return errs
	}
	for i, err := range each(func(f *Fixture) error { return rt.Run(ctx, f.ID, f.Bundle) }) {
		if err != nil {
			t.Errorf("run %d: %v", i, err)
		}
	}
	pids := make([]int, n)
	for i, f := range fs {
		st, err := rt.State(ctx, f.ID)
		if err != nil || st.Status != runtime.StatusRunning {
			t.Errorf("state %d: %+v, %v; want running", i, st, err)
		}
		pids[i] = st.Pid
	}
	for i, err := range each(func(f *Fixture) error { return rt.Delete(ctx, f.ID, true) }) {
		if err != nil {
			t.Errorf("delete %d: %v", i, err)
		}
	}
	for i, f := range fs {
		assertGone(t, f, pids[i])
	}
}
