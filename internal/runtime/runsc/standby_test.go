package runsc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/runtime/ocicli"
	"github.com/forkbox/forkbox/internal/runtime/spec"
	"github.com/forkbox/forkbox/internal/runtime/testsuite"
)

// standbyBinary is the runsc the standby tests run: FORKBOX_TEST_RUNSC, or
// runsc from PATH. It must be forkbox's build (standby.patch).
func standbyBinary(t *testing.T) string {
	t.Helper()
	requireRunsc(t)
	if b := os.Getenv("FORKBOX_TEST_RUNSC"); b != "" {
		return b
	}
	return "runsc"
}

// awaitStandby waits (bounded) until rt has a standby ready and returns its
// pid.
func awaitStandby(t *testing.T, rt *Runsc) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pid, err := rt.standby.awaitReady(ctx)
	if err != nil {
		t.Fatalf("no standby ready: %v (%+v)", err, rt.StandbyStats())
	}
	return pid
}

// alive reports whether pid is a process (not yet reaped).
func alive(pid int) bool { return syscall.Kill(pid, 0) == nil }

// wrapperRunsc writes a shell script at path that runs bin, unsetting the
// standby variable first when hide is set (a runsc without standby.patch).
func wrapperRunsc(t *testing.T, path, bin string, hide bool) {
	t.Helper()
	real, err := exec.LookPath(bin)
	if err != nil {
		t.Fatal(err)
	}
	unset := ""
	if hide {
		unset = "unset " + standbyEnv + "\n"
	}
	tmp := path + ".new"
	if err := os.WriteFile(tmp, []byte("#!/bin/sh\n"+unset+"exec "+real+" \"$@\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil { // a new inode: a replaced binary
		t.Fatal(err)
	}
}

// A run in a standby: the command runs with the caller's stdio (the
// container's output reaches its log), the standby is reaped, another takes
// its place, and Close leaves no standby behind.
func TestStandbyRunsCommand(t *testing.T) {
	// runsc's debug log names the pid of the runsc that wrote it.
	debugLog := t.TempDir()
	f := newFixture(t, Options{Binary: standbyBinary(t), Standby: 1,
		ExtraFlags: []string{"--debug", "--debug-log=" + debugLog + "/"}}, spec.SpecOptions{
		Args: []string{"/bin/sh", "-c", "echo from-the-container; sleep 1000"},
	})
	rt := f.rt
	pid := awaitStandby(t, rt)
	// It started at the lowest priority and, ready, has the caller's back
	// on every thread (the command must not run niced).
	if got, want := threadNices(t, pid), threadNice(); len(got) != 1 || !got[want] {
		t.Errorf("standby %d threads' nice values %v, want all %d", pid, got, want)
	}
	ctx := context.Background()
	if err := rt.Run(ctx, f.ID, f.Bundle); err != nil {
		t.Fatalf("run: %v", err)
	}
	if s := rt.StandbyStats(); s.Hits != 1 || s.Misses != 0 {
		t.Errorf("stats %+v, want 1 hit, no miss", s)
	}
	if alive(pid) {
		t.Errorf("standby %d still there after its command", pid)
	}
	f.WaitLog(t, "from-the-container", 30*time.Second)
	// The command ran in the standby: runsc's own log names its pid.
	runLogs, _ := filepath.Glob(filepath.Join(debugLog, "*.run.txt"))
	if len(runLogs) != 1 {
		t.Fatalf("run's debug logs: %q, want one", runLogs)
	}
	if b, _ := os.ReadFile(runLogs[0]); !strings.Contains(string(b), fmt.Sprintf(" PID %d,", pid)) {
		t.Errorf("runsc run's debug log does not name the standby's pid %d:\n%s", pid, ocicli.LastLines(string(b), 5))
	}
	next := awaitStandby(t, rt)
	if next == pid {
		t.Fatalf("the same standby %d offered twice", pid)
	}
	if err := rt.Delete(ctx, f.ID, true); err != nil {
		t.Fatal(err)
	}
	assertNoTrace(t, f)
	rt.Close()
	if alive(next) {
		t.Errorf("standby %d left after Close", next)
	}
	if s := rt.StandbyStats(); s.Ready != 0 {
		t.Errorf("stats after Close %+v, want none ready", s)
	}
}

// Where no standby can take a command, runsc is started as before: a runsc
// without the patch, a binary replaced since the standby started, a
// standby that died.
func TestStandbyFallsBack(t *testing.T) {
	bin := standbyBinary(t)
	so := spec.SpecOptions{Args: []string{"/bin/sh", "-c", "echo up; sleep 1000"}}
	ctx := context.Background()

	t.Run("no standby mode", func(t *testing.T) {
		wrapper := filepath.Join(t.TempDir(), "runsc")
		wrapperRunsc(t, wrapper, bin, true)
		f := newFixture(t, Options{Binary: wrapper, Standby: 2}, so)
		f.rt.standby.wg.Wait() // the slots give up on such a binary
		if err := f.rt.Run(ctx, f.ID, f.Bundle); err != nil {
			t.Fatalf("run: %v", err)
		}
		f.WaitLog(t, "up", 30*time.Second)
		if s := f.rt.StandbyStats(); !s.Unsupported || s.Hits != 0 || s.Misses != 1 {
			t.Errorf("stats %+v, want unsupported, 1 miss", s)
		}
	})

	t.Run("binary replaced", func(t *testing.T) {
		wrapper := filepath.Join(t.TempDir(), "runsc")
		wrapperRunsc(t, wrapper, bin, false)
		f := newFixture(t, Options{Binary: wrapper, Standby: 1}, so)
		old := awaitStandby(t, f.rt)
		wrapperRunsc(t, wrapper, bin, false)
		if err := f.rt.Run(ctx, f.ID, f.Bundle); err != nil {
			t.Fatalf("run: %v", err)
		}
		f.WaitLog(t, "up", 30*time.Second)
		if s := f.rt.StandbyStats(); s.Stale != 1 || s.Hits != 0 {
			t.Errorf("stats %+v, want 1 stale, no hit", s)
		}
		if pid := awaitStandby(t, f.rt); pid == old {
			t.Errorf("the stale standby %d offered again", old)
		}
		// The next one, of the new binary, is used.
		g := testsuite.NewFixture(t, f.rt, so)
		if err := f.rt.Run(ctx, g.ID, g.Bundle); err != nil {
			t.Fatalf("run: %v", err)
		}
		if s := f.rt.StandbyStats(); s.Hits != 1 {
			t.Errorf("stats %+v, want 1 hit", s)
		}
	})

	t.Run("standby died", func(t *testing.T) {
		f := newFixture(t, Options{Binary: bin, Standby: 1}, so)
		pid := awaitStandby(t, f.rt)
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		if err := f.rt.Run(ctx, f.ID, f.Bundle); err != nil {
			t.Fatalf("run: %v", err)
		}
		f.WaitLog(t, "up", 30*time.Second)
		if s := f.rt.StandbyStats(); s.Lost != 1 || s.Hits != 0 {
			t.Errorf("stats %+v, want 1 lost, no hit", s)
		}
	})
}

// A caller that goes away while its command runs in a standby kills it, as
// exec.CommandContext does, and the half-made container is deleted. The
// command is held in a createRuntime hook until the test cancels.
func TestStandbyCanceled(t *testing.T) {
	rt := newRuntime(t, Options{Binary: standbyBinary(t), Standby: 1})
	// The hook's sleep, named by its unique duration, is left by the
	// killed CLI (as by a killed runsc run): the test ends it.
	marker := fmt.Sprintf("1000.%d", time.Now().UnixNano()%1e9)
	t.Cleanup(func() { exec.Command("pkill", "-f", "sleep "+marker).Run() })
	var f *testsuite.Fixture
	f = testsuite.NewFixture(t, rt, spec.SpecOptions{Args: []string{"/bin/sleep", "1000"}}, func(s *specs.Spec) {
		s.Hooks = &specs.Hooks{CreateRuntime: []specs.Hook{{
			Path: "/bin/sh",
			Args: []string{"sh", "-c", "echo in > \"$1\"; exec sleep \"$0\"", marker, filepath.Join(s.Root.Path, "entered")},
		}}}
	})
	pid := awaitStandby(t, rt)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- rt.Run(ctx, f.ID, f.Bundle) }()
	f.WaitFile(t, "entered", time.Minute) // the command is in its hook
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Errorf("run: got %v, want Canceled", err)
	}
	if alive(pid) {
		t.Errorf("standby %d still there after its caller went", pid)
	}
	if s := rt.StandbyStats(); s.Hits != 1 {
		t.Errorf("stats %+v, want the command in the standby", s)
	}
	if _, err := rt.State(context.Background(), f.ID); !errdefs.IsNotFound(err) {
		t.Errorf("state after a canceled run: got %v, want NotFound", err)
	}
	exec.Command("pkill", "-f", "sleep "+marker).Run()
	assertNoTrace(t, &fixture{Fixture: f, rt: rt})
}

// threadNices returns the nice values of pid's threads.
func threadNices(t *testing.T, pid int) map[int]bool {
	t.Helper()
	stats, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/stat", pid))
	nices := map[int]bool{}
	for _, p := range stats {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // a thread that ended
		}
		// Fields after the command's closing parenthesis: state is 3,
		// nice is 19.
		f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
		var n int
		fmt.Sscan(f[19-3], &n)
		nices[n] = true
	}
	return nices
}

// Work no one waits for (Background) starts runsc itself and leaves the
// standby to the next call.
func TestStandbyLeftToForeground(t *testing.T) {
	f := newFixture(t, Options{Binary: standbyBinary(t), Standby: 1}, spec.SpecOptions{
		Args: []string{"/bin/sh", "-c", "echo up; sleep 1000"},
	})
	pid := awaitStandby(t, f.rt)
	if err := f.rt.Run(Background(context.Background()), f.ID, f.Bundle); err != nil {
		t.Fatalf("run: %v", err)
	}
	f.WaitLog(t, "up", 30*time.Second)
	if s := f.rt.StandbyStats(); s.Hits != 0 || s.Misses != 0 || s.Ready != 1 {
		t.Errorf("stats %+v, want the standby untouched", s)
	}
	if !alive(pid) || awaitStandby(t, f.rt) != pid {
		t.Errorf("standby %d not left ready", pid)
	}
}
