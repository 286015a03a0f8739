package agent

import (
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
)

// TestPtyInputBoundedByBytesNotFrames: a client that sends its input one
// byte per frame costs the agent (PID 1, never OOM-killed) no more than one
// that sends it in one frame: the queue is one buffer of at most MaxPtyInput.
func TestPtyInputBoundedByBytesNotFrames(t *testing.T) {
	in := newPtyInput()
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	for i := 0; i < 2*MaxPtyInput; i++ {
		b := make([]byte, 1) // as readFrame allocates each payload
		b[0] = 'x'
		in.push(b)
	}
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	n, capacity := in.queued()
	if n != MaxPtyInput || in.droppedBytes() != MaxPtyInput {
		t.Errorf("queued %d, dropped %d; want %d each", n, in.droppedBytes(), MaxPtyInput)
	}
	if capacity > 2*MaxPtyInput {
		t.Errorf("queue holds %d bytes of buffer for %d queued", capacity, n)
	}
	if grew := int64(after.HeapInuse) - int64(before.HeapInuse); grew > 8<<20 {
		t.Errorf("heap grew by %d bytes for %d bytes of queued input", grew, n)
	}
	runtime.KeepAlive(in)
}

// procState returns the state letter of /proc/pid/stat ("" if gone).
func procState(pid int) string {
	b, err := os.ReadFile("/proc/" + itoa(pid) + "/stat")
	if err != nil {
		return ""
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return ""
	}
	return s[i+2 : i+3]
}

func countFDs(t *testing.T) int {
	t.Helper()
	names, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(names)
}

func (s *Server) execCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.execs)
}

// TestPtyStalledClientEnds: a client starts `yes` on a terminal and never
// reads what it prints, then kills it. The exec ends anyway (its output
// pump stops writing to the stuck connection after a bounded grace), and
// every goroutine and fd it used is released.
func TestPtyStalledClientEnds(t *testing.T) {
	s, c := startServerWith(t, Config{})
	ctx := testCtx(t)
	if _, err := c.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	goroutines, fds := runtime.NumGoroutine(), countFDs(t)

	p, err := c.Pty(ctx, ExecRequest{Argv: []string{"yes"}}, PtySize{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	// Wait until yes is blocked writing to a full terminal: the agent's
	// pump is then blocked writing to the connection nobody reads.
	deadline := time.Now().Add(20 * time.Second)
	for asleep := 0; asleep < 20; {
		if time.Now().After(deadline) {
			t.Fatalf("yes never blocked on its terminal (state %q)", procState(p.Pid()))
		}
		if procState(p.Pid()) == "S" {
			asleep++
		} else {
			asleep = 0
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := p.Kill(); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(drainGrace + ptyWriteGrace + 20*time.Second)
	for s.execCount() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the pty exec of a client that does not read never ended")
		}
		time.Sleep(20 * time.Millisecond)
	}
	p.Close()
	for {
		g, f := runtime.NumGoroutine(), countFDs(t)
		if g <= goroutines && f <= fds {
			break
		}
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("goroutines %d (before %d), fds %d (before %d):\n%s", g, goroutines, f, fds, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestPtySessionJobsDieWithIt: a job that ignores SIGHUP and leaves the
// terminal (nohup) does not outlive its session's end.
func TestPtySessionJobsDieWithIt(t *testing.T) {
	c := startServer(t, Config{})
	ctx := testCtx(t)
	p, _, done := startPty(t, ctx, c, ExecRequest{Shell: "trap '' HUP; nohup sleep 1000 & exit 0", Cwd: t.TempDir()}, PtySize{})
	t.Cleanup(func() { killSessionAll(p.Pid()) })
	if res := waitResult(t, done); res.ExitCode != 0 {
		t.Fatalf("got %+v, want exit 0", res)
	}
	for pid, st := range scanProcs(1) {
		if st.sid == p.Pid() {
			comm, _ := readFileString("/proc/" + itoa(pid) + "/comm")
			t.Errorf("process %d (%s) of the session outlived it", pid, comm)
		}
	}
}
