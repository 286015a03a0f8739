package agent

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/forkbox/forkbox/errdefs"
)

// termOutput collects what a terminal prints and lets a test wait for text.
type termOutput struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	changed chan struct{}
}

func newTermOutput() *termOutput { return &termOutput{changed: make(chan struct{}, 1)} }

func (o *termOutput) write(p []byte) error {
	o.mu.Lock()
	o.buf.Write(p)
	o.mu.Unlock()
	select {
	case o.changed <- struct{}{}:
	default:
	}
	return nil
}

func (o *termOutput) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.String()
}

// waitFor waits until the output holds want after offset from, and returns
// the offset just past it.
func (o *termOutput) waitFor(t *testing.T, from int, want string) int {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		s := o.String()
		if i := strings.Index(s[min(from, len(s)):], want); i >= 0 {
			return from + i + len(want)
		}
		select {
		case <-o.changed:
		case <-deadline:
			t.Fatalf("terminal never printed %q; it printed %q", want, s)
		}
	}
}

// startPty starts req on a terminal and waits for it in the background.
func startPty(t *testing.T, ctx context.Context, c *Client, req ExecRequest, size PtySize) (*Pty, *termOutput, <-chan ExecResult) {
	t.Helper()
	p, err := c.Pty(ctx, req, size)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	out := newTermOutput()
	done := make(chan ExecResult, 1)
	go func() {
		res, err := p.Wait(out.write)
		if err != nil {
			res.ExitCode = -1
			res.Signal = err.Error()
		}
		done <- res
	}()
	return p, out, done
}

func waitResult(t *testing.T, done <-chan ExecResult) ExecResult {
	t.Helper()
	select {
	case res := <-done:
		return res
	case <-time.After(20 * time.Second):
		t.Fatal("the pty exec did not end")
	}
	return ExecResult{}
}

// waitProc waits until a process named comm runs in session sid.
func waitProc(t *testing.T, sid int, comm string, present bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		found := false
		for pid, p := range scanProcs(1) {
			if p.sid == sid {
				if b, _ := readFileString("/proc/" + itoa(pid) + "/comm"); b == comm {
					found = true
				}
			}
		}
		if found == present {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %q in session %d: present %v, want %v", comm, sid, found, present)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestPtySizeAndTTY(t *testing.T) {
	c := startServer(t, Config{})
	ctx := testCtx(t)
	_, out, done := startPty(t, ctx, c, ExecRequest{Shell: "tty; stty size; echo TERM=$TERM"}, PtySize{Rows: 30, Cols: 100})
	res := waitResult(t, done)
	s := out.String()
	if res.ExitCode != 0 || !strings.Contains(s, "/dev/pts/") || !strings.Contains(s, "30 100\r\n") || !strings.Contains(s, "TERM=xterm") {
		t.Errorf("got exit %d output %q, want exit 0, /dev/pts/N, \"30 100\", TERM=xterm", res.ExitCode, s)
	}
}

// TestPtyInteractiveShell drives a shell as a user would: resize, ^C of a
// foreground job, exit code.
func TestPtyInteractiveShell(t *testing.T) {
	c := startServer(t, Config{})
	ctx := testCtx(t)
	p, out, done := startPty(t, ctx, c, ExecRequest{Argv: []string{"sh"}, Env: map[string]string{"PS1": "$ "}}, PtySize{Rows: 24, Cols: 80})
	type_ := func(s string) {
		t.Helper()
		if err := p.Input([]byte(s)); err != nil {
			t.Fatal(err)
		}
	}
	type_("stty size; echo one-$((1+1))\n")
	at := out.waitFor(t, 0, "24 80\r\none-2")
	if err := p.Resize(PtySize{Rows: 50, Cols: 132}); err != nil {
		t.Fatal(err)
	}
	type_("stty size; echo two-$((1+2))\n")
	at = out.waitFor(t, at, "50 132\r\ntwo-3")

	type_("sleep 100\n")
	waitProc(t, p.Pid(), "sleep", true)
	type_("\x03")
	waitProc(t, p.Pid(), "sleep", false)
	type_("echo rc=$?\n")
	at = out.waitFor(t, at, "rc=130")

	type_("exit 7\n")
	if res := waitResult(t, done); res.ExitCode != 7 || res.Signal != "" {
		t.Errorf("got exit %d signal %q, want exit 7", res.ExitCode, res.Signal)
	}
}

func TestPtyKillAndCancelReachTheSession(t *testing.T) {
	c := startServer(t, Config{})
	ctx := testCtx(t)
	p, _, done := startPty(t, ctx, c, ExecRequest{Argv: []string{"sh"}}, PtySize{})
	p.Input([]byte("sleep 100\n"))
	waitProc(t, p.Pid(), "sleep", true)
	if err := p.Kill(); err != nil {
		t.Fatal(err)
	}
	if res := waitResult(t, done); res.Signal != "SIGKILL" {
		t.Errorf("got %+v, want killed by SIGKILL", res)
	}
	// The job, in its own process group, died with the session.
	waitProc(t, p.Pid(), "sleep", false)

	cctx, cancel := context.WithCancel(ctx)
	p2, _, done2 := startPty(t, cctx, c, ExecRequest{Argv: []string{"sh"}}, PtySize{})
	p2.Input([]byte("sleep 100\n"))
	waitProc(t, p2.Pid(), "sleep", true)
	cancel()
	waitResult(t, done2)
	waitProc(t, p2.Pid(), "sleep", false)
	waitProc(t, p2.Pid(), "sh", false)
}

func TestPtyTimeout(t *testing.T) {
	c := startServer(t, Config{})
	ctx := testCtx(t)
	_, _, done := startPty(t, ctx, c, ExecRequest{Shell: "sleep 30", Timeout: 200 * time.Millisecond}, PtySize{})
	if res := waitResult(t, done); !res.TimedOut || res.Signal != "SIGKILL" {
		t.Errorf("got %+v, want timed out by SIGKILL", res)
	}
}

// TestPtyAbuse sends what a hostile or broken client might: sizes out of
// bounds, a bad resize frame, far more input than the terminal reads.
func TestPtyAbuse(t *testing.T) {
	c := startServer(t, Config{})
	ctx := testCtx(t)
	for _, sz := range []PtySize{{Rows: MaxPtyRows + 1, Cols: 80}, {Rows: 24, Cols: -1}, {Rows: 70000, Cols: 70000}} {
		if _, err := c.Pty(ctx, ExecRequest{Argv: []string{"true"}}, sz); !errdefs.IsInvalidArgument(err) {
			t.Errorf("size %+v: got %v, want InvalidArgument", sz, err)
		}
	}
	if _, err := c.Pty(ctx, ExecRequest{Argv: []string{"no-such-binary-xyz"}}, PtySize{}); !errdefs.IsNotFound(err) {
		t.Errorf("missing binary: got %v, want NotFound", err)
	}
	if err := (&Pty{}).Resize(PtySize{Rows: 0, Cols: 80}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("Resize 0x80: got %v, want InvalidArgument", err)
	}

	p, out, done := startPty(t, ctx, c, ExecRequest{Argv: []string{"sh"}, Env: map[string]string{"PS1": "$ "}}, PtySize{Rows: 24, Cols: 80})
	// A resize the agent must refuse: the size stays.
	if err := p.send(frameResize, 0, []byte(`{"rows":100000,"cols":5}`)); err != nil {
		t.Fatal(err)
	}
	if err := p.send(frameResize, 0, []byte(`not json`)); err != nil {
		t.Fatal(err)
	}
	p.Input([]byte("stty size; echo one-$((1+1))\n"))
	out.waitFor(t, 0, "24 80\r\none-2")

	// 8 MiB of input for a command that reads none: the agent keeps at
	// most MaxPtyInput of it and still answers a kill at once.
	p.Input([]byte("sleep 100\n"))
	waitProc(t, p.Pid(), "sleep", true)
	flood := bytes.Repeat([]byte("x"), 8<<20)
	sent := make(chan error, 1)
	go func() { sent <- p.Input(flood) }()
	select {
	case err := <-sent:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the agent stopped reading input from a terminal that does not read it")
	}
	if err := p.Kill(); err != nil {
		t.Fatal(err)
	}
	if res := waitResult(t, done); res.Signal != "SIGKILL" {
		t.Errorf("got %+v, want killed by SIGKILL", res)
	}
	if _, err := c.Ping(ctx); err != nil {
		t.Errorf("agent after the flood: %v", err)
	}
}

func TestPtyStdinRefused(t *testing.T) {
	c := startServer(t, Config{})
	_, err := c.Pty(testCtx(t), ExecRequest{Argv: []string{"cat"}, Stdin: []byte("x")}, PtySize{})
	if !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("got %v, want InvalidArgument", err)
	}
}

// TestPtyKeepsLimits: a pty exec goes through the pids helper and the memory
// watchdog as any exec: RLIMIT_NPROC is set, and a job that over-allocates
// is killed and marks the exec OOM-killed while the shell goes on.
func TestPtyKeepsLimits(t *testing.T) {
	if _, err := os.Stat("/bin/dd"); err != nil {
		t.Skip("needs /bin/dd")
	}
	c := startServer(t, Config{PidsLimit: 37, MemoryLimit: 64 << 20})
	ctx := testCtx(t)
	_, out, done := startPty(t, ctx, c, ExecRequest{
		Shell: "grep 'Max processes' /proc/self/limits; dd if=/dev/zero of=" + stuckFifo(t) + " bs=300M count=1 2>/dev/null; echo rc=$?",
	}, PtySize{})
	res := waitResult(t, done)
	s := out.String()
	if f := strings.Fields(s); len(f) < 4 || f[2] != "37" || f[3] != "37" {
		t.Errorf("limits line: got %q, want soft and hard 37", s)
	}
	if !strings.Contains(s, "rc=137") || !res.OOMKilled || res.ExitCode != 0 {
		t.Errorf("got %+v, output %q; want the job OOM-killed (rc=137), the shell's exit 0", res, s)
	}
}
