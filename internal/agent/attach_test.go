package agent

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/forkbox/forkbox/errdefs"
)

// A detached exec outlives its connection (as across a hibernation) and an
// attach collects its later output and its result; an exec that is not
// detached dies with its connection and cannot be attached to.
func TestAttachToDetachedExec(t *testing.T) {
	c := startServer(t, Config{})
	ctx := testCtx(t)
	dir := t.TempDir()
	gate := filepath.Join(dir, "go")
	script := "echo one; while [ ! -f " + gate + " ]; do sleep 0.01; done; echo two; echo err >&2; exit 5"
	start := func(detach bool) int {
		t.Helper()
		cl, err := c.open(ctx, request{Op: opExec, Exec: &ExecRequest{Argv: []string{"sh", "-c", script}}, Notify: true, Detach: detach})
		if err != nil {
			t.Fatal(err)
		}
		cl.bw.Flush()
		var st startResult
		if err := cl.result(ctx, opExec, nil, &st, frameStarted); err != nil {
			t.Fatal(err)
		}
		cl.close() // the connection fails: no kill frame
		return st.Pid
	}
	pid := start(true)
	var out, errb syncBuffer
	done := make(chan ExecResult, 1)
	attached := make(chan int, 1)
	go func() {
		res, err := c.Attach(ctx, pid, ExecIO{Stdout: &out, Stderr: &errb, Started: func(p int) { attached <- p }})
		if err != nil {
			t.Error(err)
		}
		done <- res
	}()
	if got := <-attached; got != pid {
		t.Fatalf("attach started: got pid %d, want %d", got, pid)
	}
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	res := <-done
	// "one" may have gone to the failed connection, or wait in the pipe.
	if o := out.String(); res.ExitCode != 5 || (o != "two\n" && o != "one\ntwo\n") || errb.String() != "err\n" {
		t.Fatalf("attached: got exit %d, stdout %q, stderr %q; want 5, %q, %q", res.ExitCode, o, errb.String(), "[one\n]two\n", "err\n")
	}
	// The result may not have reached the first client, as far as the
	// agent knows: an attach to the ended exec gets it, once.
	if res, err := c.Attach(ctx, pid, ExecIO{}); err != nil || res.ExitCode != 5 {
		t.Fatalf("attach to an ended exec: got %+v, %v; want its result, exit 5", res, err)
	}
	if _, err := c.Attach(ctx, pid, ExecIO{}); !errdefs.IsNotFound(err) {
		t.Fatalf("attach to an ended exec whose result was taken: got %v, want NotFound", err)
	}
	os.Remove(gate)
	pid = start(false)
	if _, err := c.Attach(ctx, pid, ExecIO{}); !errdefs.IsNotFound(err) {
		t.Fatalf("attach to an exec that is not detached: got %v, want NotFound", err)
	}
	waitFor(t, func() bool { return syscall.Kill(pid, 0) == syscall.ESRCH })
}

// A detached exec that ends while no client is attached (its session was
// cut, as across a hibernation) keeps its result for the next attach,
// which gets it once: the exit code is not lost with the connection.
func TestAttachAfterDetachedExecEnded(t *testing.T) {
	s, c0 := startServerWith(t, Config{})
	c := NewSessionClient(c0.addr, testToken) // a session: the cut is seen by the agent's next write
	defer c.Close()
	ctx := testCtx(t)
	cl, err := c.open(ctx, request{Op: opExec, Exec: &ExecRequest{Argv: []string{"sh", "-c", "read x; exit 3"}}, Notify: true, Detach: true, HasStdin: true})
	if err != nil {
		t.Fatal(err)
	}
	cl.bw.Flush()
	var started startResult
	if err := cl.result(ctx, opExec, nil, &started, frameStarted); err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	st := s.execs[started.Pid]
	s.mu.Unlock()
	if st == nil {
		t.Fatalf("exec %d not running", started.Pid)
	}
	cl.close() // stdin ends with the connection: read returns, sh exits 3
	<-st.finished
	res, err := c.Attach(ctx, started.Pid, ExecIO{})
	if err != nil || res.ExitCode != 3 {
		t.Fatalf("attach after the end: %+v, %v; want exit 3", res, err)
	}
	if _, err := c.Attach(ctx, started.Pid, ExecIO{}); !errdefs.IsNotFound(err) {
		t.Fatalf("second attach: %v, want NotFound (the result was taken)", err)
	}
}
