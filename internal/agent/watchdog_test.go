package agent

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestWatchdogKillsOverAllocatingChild(t *testing.T) {
	if _, err := os.Stat("/bin/dd"); err != nil {
		t.Skip("needs /bin/dd")
	}
	c := startServer(t, Config{MemoryLimit: 64 << 20})
	ctx := testCtx(t)
	start := time.Now()
	res, err := c.Exec(ctx, ExecRequest{Argv: []string{"dd", "if=/dev/zero", "of=" + stuckFifo(t), "bs=300M", "count=1"}}, nil, nil)
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
	res, err := c.Exec(ctx, ExecRequest{Shell: "dd if=/dev/zero of=" + stuckFifo(t) + " bs=300M count=1 2>/dev/null; echo $?"}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !res.OOMKilled || res.ExitCode != 0 {
		t.Errorf("got %+v, want oom_killed with the shell's exit 0", res)
	}
}

func TestReadStat(t *testing.T) {
	st, ok := readStat("/proc/self/stat", make([]byte, 1024))
	sid, _ := unix.Getsid(0)
	if !ok || st.ppid != os.Getppid() || st.sid != sid || st.rss <= 0 {
		t.Errorf("readStat(self): got %+v, %v; want ppid %d, sid %d and rss > 0", st, ok, os.Getppid(), sid)
	}
}

// stuckFifo returns a FIFO that the test holds open for reading and never
// reads. A hog that writes its buffer there (dd of=FIFO) allocates it, fills
// it, then blocks holding it until it is killed: whatever the watchdog's
// timing, it finds the hog, so the tests wait for the kill, not for time.
func stuckFifo(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "stuck")
	if err := unix.Mkfifo(p, 0o600); err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return p
}

// waitGone waits until pid has exited (a pidfd polls readable), or the
// test's context ends.
func waitGone(ctx context.Context, t *testing.T, pid int) {
	t.Helper()
	fd, err := unix.PidfdOpen(pid, 0)
	if err == unix.ESRCH {
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	for ctx.Err() == nil {
		n, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 1000)
		if err == nil && n > 0 {
			return
		}
	}
	t.Fatalf("process %d still there: %v", pid, ctx.Err())
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
	pid, err := c.Start(ctx, ExecRequest{Shell: "sleep 0.3; exec dd if=/dev/zero of=" + stuckFifo(t) + " bs=300M count=1"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(-pid, syscall.SIGKILL) })
	waitGone(ctx, t, pid)
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
	// The orphan reports dd's status on a FIFO the test reads: the read
	// ends when the orphan wrote it.
	status := filepath.Join(t.TempDir(), "status")
	if err := unix.Mkfifo(status, 0o600); err != nil {
		t.Fatal(err)
	}
	res, err := c.Exec(ctx, ExecRequest{Shell: "(sleep 0.3; dd if=/dev/zero of=" + stuckFifo(t) + " bs=300M count=1; echo $? >" +
		status + ") </dev/null >/dev/null 2>&1 &"}, nil, nil)
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("exec: got %+v, %v", res, err)
	}
	t.Cleanup(func() { syscall.Kill(-res.Pid, syscall.SIGKILL) })
	got := make(chan string, 1)
	go func() {
		b, _ := os.ReadFile(status) // blocks until the orphan opens and closes it
		got <- strings.TrimSpace(string(b))
	}()
	select {
	case code := <-got:
		if code != "137" {
			t.Errorf("orphaned dd exited with %q, want 137 (SIGKILL)", code)
		}
	case <-ctx.Done():
		t.Fatal("orphaned dd did not finish")
	}
	if _, err := c.Ping(ctx); err != nil {
		t.Fatalf("agent gone after the kill: %v", err)
	}
}

// TestWatchdogIdleDoesNotPoll: with no process but the agent, the watchdog
// arms no timer (an idle sandbox costs its host no CPU), and the next
// process wakes it: an over-allocating exec after it went idle is still
// killed.
func TestWatchdogIdleDoesNotPoll(t *testing.T) {
	if _, err := os.Stat("/bin/dd"); err != nil {
		t.Skip("needs /bin/dd")
	}
	s, c := startServerWith(t, Config{MemoryLimit: 64 << 20})
	ctx := testCtx(t)
	if res, err := c.Exec(ctx, ExecRequest{Argv: []string{"true"}}, nil, nil); err != nil || res.ExitCode != 0 {
		t.Fatalf("exec true: %+v, %v", res, err)
	}
	// It goes idle (no timer armed) once the exec is gone.
	deadline := time.Now().Add(30 * time.Second)
	for !s.watch.idle.Load() {
		if time.Now().After(deadline) {
			t.Fatal("the watchdog keeps a timer with nothing running")
		}
		runtime.Gosched()
	}
	res, err := c.Exec(ctx, ExecRequest{Argv: []string{"dd", "if=/dev/zero", "of=" + stuckFifo(t), "bs=300M", "count=1"}}, nil, nil)
	if err != nil || !res.OOMKilled {
		t.Fatalf("dd of 300M after the watchdog went idle: got %+v, %v; want OOM-killed", res, err)
	}
}
