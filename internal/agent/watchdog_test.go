package agent

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestWatchdogKillsOverAllocatingChild(t *testing.T) {
	if _, err := os.Stat("/bin/dd"); err != nil {
		t.Skip("needs /bin/dd")
	}
	c := startServer(t, Config{MemoryLimit: 64 << 20})
	ctx := testCtx(t)
	start := time.Now()
	res, err := c.Exec(ctx, ExecRequest{Argv: []string{"dd", "if=/dev/zero", "of=/dev/null", "bs=300M", "count=1"}}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !res.OOMKilled || res.Signal != "SIGKILL" || res.ExitCode != 137 {
		t.Errorf("got %+v, want oom_killed by SIGKILL", res)
	}
	t.Logf("killed after %v", time.Since(start))
	// The agent survived and still serves; a small exec is left alone.
	res, err = c.Exec(ctx, ExecRequest{Argv: []string{"dd", "if=/dev/zero", "of=/dev/null", "bs=1M", "count=10"}}, nil, nil)
	if err != nil || res.OOMKilled || res.ExitCode != 0 {
		t.Errorf("small exec after the kill: got %+v, %v; want exit 0", res, err)
	}
}

func TestWatchdogAttributesDescendant(t *testing.T) {
	c := startServer(t, Config{MemoryLimit: 64 << 20})
	ctx := testCtx(t)
	// The hog is a grandchild: the shell survives and reports dd's status.
	res, err := c.Exec(ctx, ExecRequest{Shell: "dd if=/dev/zero of=/dev/null bs=300M count=1 2>/dev/null; echo $?"}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !res.OOMKilled || res.ExitCode != 0 {
		t.Errorf("got %+v, want oom_killed with the shell's exit 0", res)
	}
}

func TestReadStat(t *testing.T) {
	st, ok := readStat("/proc/self/stat", make([]byte, 1024))
	if !ok || st.ppid != os.Getppid() || st.rss <= 0 {
		t.Errorf("readStat(self): got %+v, %v; want ppid %d and rss > 0", st, ok, os.Getppid())
	}
}

// waitGone waits until pid no longer exists (was reaped).
func waitGone(t *testing.T, pid int, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for syscall.Kill(pid, 0) == nil {
		if time.Now().After(deadline) {
			t.Fatalf("process %d still there after %v", pid, timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A background exec that allocates long after it started, with no exec
// running, is killed, and the agent survives.
func TestWatchdogKillsBackgroundStart(t *testing.T) {
	if _, err := os.Stat("/bin/dd"); err != nil {
		t.Skip("needs /bin/dd")
	}
	logDir := t.TempDir()
	c := startServer(t, Config{MemoryLimit: 64 << 20, LogDir: logDir})
	ctx := testCtx(t)
	pid, err := c.Start(ctx, ExecRequest{Shell: "sleep 0.3; exec dd if=/dev/zero of=/dev/null bs=300M count=1"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(-pid, syscall.SIGKILL) })
	waitGone(t, pid, 10*time.Second)
	out, err := os.ReadFile(filepath.Join(logDir, "exec-"+itoa(pid)+".log"))
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(out, []byte("records out")) {
		t.Errorf("dd finished, want it killed; its log: %q", out)
	}
	if _, err := c.Ping(ctx); err != nil {
		t.Fatalf("agent gone after the kill: %v", err)
	}
	res, err := c.Exec(ctx, ExecRequest{Argv: []string{"dd", "if=/dev/zero", "of=/dev/null", "bs=1M", "count=10"}}, nil, nil)
	if err != nil || res.OOMKilled || res.ExitCode != 0 {
		t.Errorf("small exec after the kill: got %+v, %v; want exit 0", res, err)
	}
}

// A process left behind by an exec that has ended (an orphan in the exec's
// process group, no longer the agent's descendant) is watched too.
func TestWatchdogKillsOrphan(t *testing.T) {
	if _, err := os.Stat("/bin/dd"); err != nil {
		t.Skip("needs /bin/dd")
	}
	c := startServer(t, Config{MemoryLimit: 64 << 20})
	ctx := testCtx(t)
	status := filepath.Join(t.TempDir(), "status")
	res, err := c.Exec(ctx, ExecRequest{Shell: "(sleep 0.3; dd if=/dev/zero of=/dev/null bs=300M count=1; echo $? >" +
		status + ".tmp; mv " + status + ".tmp " + status + ") </dev/null >/dev/null 2>&1 &"}, nil, nil)
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("exec: got %+v, %v", res, err)
	}
	t.Cleanup(func() { syscall.Kill(-res.Pid, syscall.SIGKILL) })
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, err := os.ReadFile(status)
		if err == nil {
			if got := strings.TrimSpace(string(b)); got != "137" {
				t.Errorf("orphaned dd exited with %s, want 137 (SIGKILL)", got)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("orphaned dd did not finish")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := c.Ping(ctx); err != nil {
		t.Fatalf("agent gone after the kill: %v", err)
	}
}
