package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/agent"
)

// liveSleeps counts the sandbox's processes running "sleep 1000" through
// the file API (no fork in the sandbox, which may have none left).
func liveSleeps(t *testing.T, sb *client.Sandbox) int {
	t.Helper()
	ctx := context.Background()
	ents, err := sb.ListFiles(ctx, "/proc")
	if err != nil {
		t.Fatalf("list /proc: %v", err)
	}
	n := 0
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name); err != nil {
			continue
		}
		b, err := sb.ReadFile(ctx, "/proc/"+e.Name+"/cmdline")
		if err == nil && string(b) == "sleep\x001000\x00" {
			n++
		}
	}
	return n
}

// TestPidsLimitRefusesForkSandboxLives: with --pids 64, a process that
// starts 200 sleeps gets EAGAIN past the limit, at most 64 of them live,
// and the sandbox (its agent, its runtime) keeps answering. Under gVisor
// the host pids cgroup also counts the runtime's own tasks; the tenant's
// limit is enforced inside (RLIMIT_NPROC) and the host one has headroom.
func TestPidsLimitRefusesForkSandboxLives(t *testing.T) {
	const limit = 64
	forEachRuntime(t, func(t *testing.T) {
		ctx := context.Background()
		o := clientOpts()
		o.Resources.Pids = limit
		sb := newSandbox(t, o)
		var errb strings.Builder
		res, err := sb.Exec(ctx, client.ExecOptions{Shell: "for i in $(seq 200); do sleep 1000 & done; echo started", Stderr: &errb, Timeout: 2 * time.Minute})
		if err != nil {
			t.Fatalf("starting 200 sleeps: %v", err)
		}
		t.Logf("200 sleeps: exit %d, stderr %q", res.ExitCode, lastLine(errb.String()))
		if !strings.Contains(errb.String(), "can't fork") && !strings.Contains(errb.String(), "Resource temporarily unavailable") {
			t.Errorf("no fork was refused; stderr %q", lastLine(errb.String()))
		}
		n := liveSleeps(t, sb)
		t.Logf("live sleeps: %d; host pids.current %s", n, hostPidsCurrent(sb.ID))
		if n == 0 || n > limit {
			t.Errorf("%d sleeps live, want between 1 and %d", n, limit)
		}
		if _, err := sb.ReadFile(ctx, "/proc/1/status"); err != nil {
			t.Fatalf("the agent does not answer after the sleeps: %v; init's log %q", err, initLog(sb.ID))
		}
		// kill is a shell builtin: it needs no fork in the sandbox. The
		// exec itself needs one: under gVisor the agent has it (the limit
		// binds only the processes it starts); under crun the host cgroup
		// is the limit, the agent included, and a full one refuses it.
		var out strings.Builder
		res, err = sb.Exec(ctx, client.ExecOptions{Shell: "kill -9 -1 2>/dev/null; echo alive", Stdout: &out})
		switch {
		case err == nil && out.String() == "alive\n":
		case curRuntime == "crun" && errdefs.IsResourceExhausted(err):
			t.Logf("exec at a full pids cgroup: %v", err)
			killCgroupTasks(t, sb.ID)
		default:
			t.Fatalf("exec after the sleeps: %+v, %v, %q; init's log %q", res, err, out.String(), initLog(sb.ID))
		}
		// Until the agent has reaped what was killed, a fork may still be
		// refused: retry on that class only.
		ctx2, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		for {
			out.Reset()
			_, err := sb.Exec(ctx2, client.ExecOptions{Shell: "echo still alive", Stdout: &out})
			if err == nil && out.String() == "still alive\n" {
				break
			}
			if !errdefs.IsResourceExhausted(err) {
				t.Fatalf("exec after the cleanup: %v, %q", err, out.String())
			}
		}
	})
}

// killCgroupTasks SIGKILLs every process of the sandbox's host pids
// cgroup but its init (crun: the agent).
func killCgroupTasks(t *testing.T, id string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/pids", cgroupParent, id, "cgroup.procs"))
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.ReadFile(filepath.Join(env.stateDir, "sandboxes", id, "init.pid"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range strings.Fields(string(b)) {
		if pid, _ := strconv.Atoi(f); pid > 0 && f != strings.TrimSpace(string(st)) {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

func initLog(id string) string {
	b, _ := os.ReadFile(filepath.Join(env.stateDir, "sandboxes", id, "stdio.log"))
	return string(tail(b, 2048))
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}

func hostPidsCurrent(id string) string {
	b, _ := os.ReadFile(filepath.Join("/sys/fs/cgroup/pids", cgroupParent, id, "pids.current"))
	return strings.TrimSpace(string(b))
}

// TestInitStdioBounded: 200 MB written to /proc/1/fd/1 and /proc/1/fd/2
// (init's stdout and stderr, a log file on the host) do not reach the host:
// the agent is not dumpable, so the tenant cannot open them, its stdout is
// /dev/null and its own log is capped. The sandbox keeps working.
func TestInitStdioBounded(t *testing.T) {
	const flood = 200 << 20
	forEachRuntime(t, func(t *testing.T) {
		sb := newSandbox(t, clientOpts())
		logPath := filepath.Join(env.stateDir, "sandboxes", sb.ID, "stdio.log")
		for _, fd := range []string{"1", "2"} {
			out, _, res := sh(t, sb, fmt.Sprintf("head -c %d /dev/zero > /proc/1/fd/%s; echo $?", flood, fd))
			t.Logf("write %d MB to /proc/1/fd/%s: %q (exit %d)", flood>>20, fd, strings.TrimSpace(out), res.ExitCode)
		}
		fi, err := os.Stat(logPath)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("host %s: %d bytes", filepath.Base(logPath), fi.Size())
		if fi.Size() > agent.MaxLogBytes+64<<10 {
			t.Errorf("host stdio log is %d bytes after the floods, want ≤ %d", fi.Size(), agent.MaxLogBytes+64<<10)
		}
		if got := mustSh(t, sb, "echo alive"); got != "alive\n" {
			t.Errorf("after the floods: %q", got)
		}
	})
}
