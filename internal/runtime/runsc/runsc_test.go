// Lifecycle tests against the real runsc binary (root only).

package runsc

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/runtime"
	"github.com/forkbox/forkbox/internal/runtime/spec"
	"github.com/forkbox/forkbox/internal/runtime/testsuite"
)

func readTrim(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatalf("read %s: %v", p, err)
	}
	return strings.TrimSpace(string(b))
}

func TestLifecycle(t *testing.T) {
	f := newFixture(t, Options{}, spec.SpecOptions{
		Args:        []string{"/bin/sh", "-c", "echo hi > /tmp/x; echo host=$(hostname); echo written; sleep 1000"},
		CPU:         0.5,
		MemoryBytes: 64 << 20,
		Pids:        100,
	})
	ctx := context.Background()
	rt := f.rt

	t0 := time.Now()
	if err := rt.Run(ctx, f.ID, f.Bundle); err != nil {
		t.Fatalf("run: %v", err)
	}
	t.Logf("run → running: %v", time.Since(t0))

	st, err := rt.State(ctx, f.ID)
	if err != nil {
		t.Fatalf("state: %v", err)
	}
	if st.Status != runtime.StatusRunning || st.Pid <= 0 {
		t.Fatalf("state = %+v, want running with pid > 0", st)
	}
	// The sandbox joined the spec's netns (no nsenter needed).
	var nsSt syscall.Stat_t
	if err := syscall.Stat(f.NetNS, &nsSt); err != nil {
		t.Fatal(err)
	}
	if link, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", st.Pid)); err != nil || link != fmt.Sprintf("net:[%d]", nsSt.Ino) {
		t.Errorf("sandbox pid %d netns = %q, %v; want net:[%d]", st.Pid, link, err, nsSt.Ino)
	}
	if err := rt.Run(ctx, f.ID, f.Bundle); !errdefs.IsAlreadyExists(err) {
		t.Errorf("second run: got %v, want AlreadyExists", err)
	}

	// Writes of the sandbox reach the host rootfs (--overlay2=none), and
	// stdout reaches the bundle's log.
	log := f.WaitLog(t, "written", 30*time.Second)
	if got := readTrim(t, filepath.Join(f.Rootfs, "tmp/x")); got != "hi" {
		t.Errorf("host rootfs tmp/x = %q, want %q", got, "hi")
	}
	if !strings.Contains(log, "host="+f.Hostname) {
		t.Errorf("log %q: want hostname %s", log, f.Hostname)
	}

	// Cgroup limits land in the v1 controllers at the spec's cgroupsPath.
	for file, want := range map[string]string{
		"memory/" + f.Cgroup + "/memory.limit_in_bytes": "67108864",
		"cpu/" + f.Cgroup + "/cpu.cfs_quota_us":         "50000",
		"cpu/" + f.Cgroup + "/cpu.cfs_period_us":        "100000",
		"pids/" + f.Cgroup + "/pids.max":                "100",
	} {
		if got := readTrim(t, filepath.Join("/sys/fs/cgroup", file)); got != want {
			t.Errorf("%s = %q, want %q", file, got, want)
		}
	}
	procs := hostProcsWith(f.ID)
	t.Logf("host processes for the sandbox: %d: %q", len(procs), procs)

	list, err := rt.List(ctx)
	if err != nil {
		t.Fatalf("list: %v", err)
	}
	if !slices.ContainsFunc(list, func(s runtime.State) bool { return s.ID == f.ID }) {
		t.Errorf("list = %+v, want %s in it", list, f.ID)
	}

	if err := rt.Resume(ctx, f.ID); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("resume running: got %v, want FailedPrecondition", err)
	}
	t0 = time.Now()
	if err := rt.Pause(ctx, f.ID); err != nil {
		t.Fatalf("pause: %v", err)
	}
	t.Logf("pause: %v", time.Since(t0))
	if st, _ := rt.State(ctx, f.ID); st.Status != runtime.StatusPaused {
		t.Errorf("after pause: status %q, want paused", st.Status)
	}
	t0 = time.Now()
	if err := rt.Resume(ctx, f.ID); err != nil {
		t.Fatalf("resume: %v", err)
	}
	t.Logf("resume: %v", time.Since(t0))
	if st, _ := rt.State(ctx, f.ID); st.Status != runtime.StatusRunning {
		t.Errorf("after resume: status %q, want running", st.Status)
	}

	t0 = time.Now()
	if err := rt.Kill(ctx, f.ID, syscall.SIGKILL, true); err != nil {
		t.Fatalf("kill: %v", err)
	}
	if err := rt.Delete(ctx, f.ID, true); err != nil {
		t.Fatalf("delete: %v", err)
	}
	t.Logf("kill + delete: %v", time.Since(t0))

	if _, err := rt.State(ctx, f.ID); !errdefs.IsNotFound(err) {
		t.Errorf("state after delete: got %v, want NotFound", err)
	}
	if err := rt.Delete(ctx, f.ID, false); err != nil {
		t.Errorf("second delete: got %v, want nil", err)
	}
	if err := rt.Kill(ctx, f.ID, syscall.SIGTERM, false); !errdefs.IsNotFound(err) {
		t.Errorf("kill after delete: got %v, want NotFound", err)
	}
	assertNoTrace(t, f)
}

// assertNoTrace checks that no process, cgroup dir or state entry of f's
// container is left on the host.
func assertNoTrace(t *testing.T, f *fixture) {
	t.Helper()
	var procs []string
	// The sandbox may take a moment to be reaped: polled, with a bound
	// against a hang.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if procs = hostProcsWith(f.ID); len(procs) == 0 || time.Now().After(deadline) {
			break
		}
	}
	if len(procs) > 0 {
		t.Errorf("processes left: %q", procs)
	}
	for _, p := range testsuite.CgroupDirs(f.Cgroup) {
		t.Errorf("cgroup dir left: %s", p)
	}
	ents, _ := os.ReadDir(f.rt.Root())
	for _, e := range ents {
		if strings.Contains(e.Name(), f.ID) {
			t.Errorf("state entry left: %s", filepath.Join(f.rt.Root(), e.Name()))
		}
	}
}

func TestRunFailureLeavesNothing(t *testing.T) {
	f := newFixture(t, Options{}, spec.SpecOptions{Args: []string{"/no/such/binary"}})
	err := f.rt.Run(context.Background(), f.ID, f.Bundle)
	if err == nil {
		t.Fatal("run of a missing binary succeeded")
	}
	t.Logf("run error: %v", err)
	if _, err := f.rt.State(context.Background(), f.ID); !errdefs.IsNotFound(err) {
		t.Errorf("state after failed run: got %v, want NotFound", err)
	}
	assertNoTrace(t, f)
}

// TestLogCause: what a failure takes from runsc's log (the shared suite's
// RunFailureSaysWhy runs a sandbox that dies as it starts).
func TestLogCause(t *testing.T) {
	p := filepath.Join(t.TempDir(), "x.log")
	old := `{"msg":"an old failure","level":"error","time":"t0"}` + "\n"
	now := `{"msg":"starting","level":"info"}{"msg":"error setting up FS: opening /a: no such file or directory\nmore","level":"error"}` +
		`{"msg":"creating container: EOF","level":"error"}`
	if err := os.WriteFile(p, []byte(old+now), 0o600); err != nil {
		t.Fatal(err)
	}
	from := int64(len(old))
	for _, c := range []struct {
		from      int64
		msg, want string
	}{
		{from, "creating container: EOF", "error setting up FS: opening /a: no such file or directory"},
		{0, "creating container: EOF", "an old failure"},
		{from, "error setting up FS: opening /a: no such file or directory; creating container: EOF", ""},
		{int64(len(old + now)), "x", ""},
	} {
		if got := logCause(p, c.from, c.msg); got != c.want {
			t.Errorf("logCause(from %d, %q) = %q, want %q", c.from, c.msg, got, c.want)
		}
	}
	if got := logCause(filepath.Join(t.TempDir(), "none.log"), 0, ""); got != "" {
		t.Errorf("logCause of no log = %q", got)
	}
	if err := os.WriteFile(p, []byte("I1205 plain text, not JSON\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := logCause(p, 0, ""); got != "" {
		t.Errorf("logCause of a text log = %q", got)
	}
}

func TestUnknownID(t *testing.T) {
	requireRunsc(t)
	rt, err := New(Options{Root: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := rt.State(ctx, "fbxtest-none"); !errdefs.IsNotFound(err) {
		t.Errorf("state: got %v, want NotFound", err)
	}
	if err := rt.Delete(ctx, "fbxtest-none", true); err != nil {
		t.Errorf("delete: got %v, want nil", err)
	}
	if err := rt.Pause(ctx, "fbxtest-none"); !errdefs.IsNotFound(err) {
		t.Errorf("pause: got %v, want NotFound", err)
	}
	if _, err := rt.State(ctx, "../x"); !errdefs.IsInvalidArgument(err) {
		t.Errorf("state ../x: got %v, want InvalidArgument", err)
	}
	if l, err := rt.List(ctx); err != nil || len(l) != 0 {
		t.Errorf("list = %v, %v; want empty", l, err)
	}
}
