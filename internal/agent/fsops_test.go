package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/forkbox/forkbox/errdefs"
)

func TestFileOps(t *testing.T) {
	c := startServer(t, Config{})
	ctx := testCtx(t)
	dir := t.TempDir()
	d := filepath.Join(dir, "a/b")
	e, err := c.MakeDir(ctx, d)
	if err != nil || !e.Mode.IsDir() || e.Path != d {
		t.Fatalf("MakeDir: got %+v, %v", e, err)
	}
	if _, err := c.MakeDir(ctx, d); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("MakeDir again: got %v, want AlreadyExists", err)
	}
	if err := os.WriteFile(filepath.Join(d, "f"), []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	e, err = c.Stat(ctx, filepath.Join(d, "f"))
	if err != nil || e.Size != 5 || e.Name != "f" || e.Mode.Perm() != 0o600 || e.Owner == "" {
		t.Fatalf("Stat: got %+v, %v", e, err)
	}
	if _, err := c.Stat(ctx, filepath.Join(d, "missing")); !errdefs.IsNotFound(err) {
		t.Fatalf("Stat missing: got %v, want NotFound", err)
	}
	os.Symlink("f", filepath.Join(d, "l"))
	if e, err := c.Stat(ctx, filepath.Join(d, "l")); err != nil || e.Symlink != "f" {
		t.Fatalf("Stat symlink: got %+v, %v", e, err)
	}
	e, err = c.Move(ctx, filepath.Join(d, "f"), filepath.Join(dir, "c/g"))
	if err != nil || e.Path != filepath.Join(dir, "c/g") || e.Size != 5 {
		t.Fatalf("Move: got %+v, %v", e, err)
	}
	ents, err := c.Walk(ctx, dir, 1)
	if err != nil {
		t.Fatal(err)
	}
	if got := names(ents, dir); got != "a c" {
		t.Fatalf("Walk depth 1: got %q, want %q", got, "a c")
	}
	ents, err = c.Walk(ctx, dir, 3)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := names(ents, dir), "a a/b a/b/l c c/g"; got != want {
		t.Fatalf("Walk depth 3: got %q, want %q", got, want)
	}
	if err := c.Remove(ctx, filepath.Join(dir, "a")); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "a")); !os.IsNotExist(err) {
		t.Fatalf("after Remove: stat got %v", err)
	}
	if err := c.Remove(ctx, filepath.Join(dir, "a")); !errdefs.IsNotFound(err) {
		t.Fatalf("Remove missing: got %v, want NotFound", err)
	}
}

// Abuse: paths that escape or are not absolute, removing /, a walk too
// deep or too wide, signals to processes that are not the agent's.
func TestFileOpsRefuse(t *testing.T) {
	c := startServer(t, Config{})
	ctx := testCtx(t)
	dir := t.TempDir()
	for _, p := range []string{"relative", dir + "/../etc", "", "/a\x00b"} {
		if _, err := c.Stat(ctx, p); !errdefs.IsInvalidArgument(err) {
			t.Errorf("Stat %q: got %v, want InvalidArgument", p, err)
		}
		if _, err := c.Move(ctx, filepath.Join(dir, "x"), p); !errdefs.IsInvalidArgument(err) {
			t.Errorf("Move to %q: got %v, want InvalidArgument", p, err)
		}
	}
	if err := c.Remove(ctx, "/"); !errdefs.IsInvalidArgument(err) {
		t.Errorf("Remove /: got %v, want InvalidArgument", err)
	}
	if _, err := c.Walk(ctx, dir, MaxWalkDepth+1); !errdefs.IsInvalidArgument(err) {
		t.Errorf("Walk too deep: got %v, want InvalidArgument", err)
	}
	for i := 0; i <= MaxWalkEntries; i++ {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprint(i)), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	wctx, wcancel := context.WithTimeout(context.Background(), 2*time.Minute) // the tree took a while
	defer wcancel()
	if _, err := c.Walk(wctx, dir, 1); !errdefs.IsResourceExhausted(err) {
		t.Errorf("Walk of %d entries: got %v, want ResourceExhausted", MaxWalkEntries+1, err)
	}
	if err := c.Signal(ctx, os.Getpid(), 15); !errdefs.IsNotFound(err) {
		t.Errorf("Signal a process the agent did not start: got %v, want NotFound", err)
	}
	if err := c.Signal(ctx, 1, 99); !errdefs.IsInvalidArgument(err) {
		t.Errorf("Signal 99: got %v, want InvalidArgument", err)
	}
}

func names(ents []Entry, root string) string {
	var out []string
	for _, e := range ents {
		rel, _ := filepath.Rel(root, e.Path)
		out = append(out, rel)
	}
	return strings.Join(out, " ")
}

// ExecStream reports the pid first, streams stdin as it is written, and a
// signal ends the command.
func TestExecStream(t *testing.T) {
	c := startServer(t, Config{})
	ctx := testCtx(t)
	pr, pw := io.Pipe()
	var out syncBuffer
	pids := make(chan int, 1)
	done := make(chan ExecResult, 1)
	go func() {
		res, err := c.ExecStream(ctx, ExecRequest{Argv: []string{"sh", "-c", "read a; echo got $a; read b; echo $b >&2; exit 3"}},
			ExecIO{Stdin: pr, Stdout: &out, Stderr: &out, Started: func(pid int) { pids <- pid }})
		if err != nil {
			t.Error(err)
		}
		done <- res
	}()
	pid := <-pids
	if pid <= 0 {
		t.Fatalf("started: got pid %d", pid)
	}
	io.WriteString(pw, "one\n")
	waitFor(t, func() bool { return strings.Contains(out.String(), "got one") })
	io.WriteString(pw, "two\n")
	res := <-done
	if res.ExitCode != 3 || res.Pid != pid || out.String() != "got one\ntwo\n" {
		t.Fatalf("got exit %d pid %d output %q, want 3, %d, %q", res.ExitCode, res.Pid, out.String(), pid, "got one\ntwo\n")
	}

	// Closing stdin is EOF; SIGTERM ends a command that ignores EOF.
	pr, pw = io.Pipe()
	go func() {
		res, err := c.ExecStream(ctx, ExecRequest{Argv: []string{"sh", "-c", "cat; sleep 60"}}, ExecIO{Stdin: pr, Started: func(pid int) { pids <- pid }})
		if err != nil {
			t.Error(err)
		}
		done <- res
	}()
	pid = <-pids
	pw.Close()
	if err := c.Signal(ctx, pid, 15); err != nil {
		t.Fatal(err)
	}
	if res := <-done; res.Signal != "SIGTERM" {
		t.Fatalf("after SIGTERM: got %+v", res)
	}
	if err := c.Signal(ctx, pid, 9); !errdefs.IsNotFound(err) {
		t.Fatalf("signal an ended exec: got %v, want NotFound", err)
	}
}

func TestWatch(t *testing.T) {
	c := startServer(t, Config{})
	ctx := testCtx(t)
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "old"), []byte("x"), 0o644)
	os.Mkdir(filepath.Join(dir, "sub"), 0o755)
	var mu sync.Mutex
	var got []string
	started := make(chan struct{})
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- c.Watch(wctx, dir, true, func() { close(started) }, func(evs []WatchEvent) error {
			mu.Lock()
			defer mu.Unlock()
			for _, e := range evs {
				got = append(got, e.Op+" "+e.Entry.Path)
			}
			return nil
		})
	}()
	<-started
	os.WriteFile(filepath.Join(dir, "sub/new"), []byte("hello"), 0o644)
	os.Rename(filepath.Join(dir, "old"), filepath.Join(dir, "renamed"))
	want := []string{"create sub/new", "rename old", "create renamed"}
	waitFor(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, w := range want {
			if !contains(got, w) {
				return false
			}
		}
		return true
	})
	os.WriteFile(filepath.Join(dir, "sub/new"), []byte("hello, longer"), 0o644)
	os.Remove(filepath.Join(dir, "renamed"))
	waitFor(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return contains(got, "write sub/new") && contains(got, "remove renamed")
	})
	cancel()
	if err := <-done; err == nil || !(errors.Is(err, errdefs.ErrCanceled)) {
		t.Fatalf("Watch after cancel: got %v, want Canceled", err)
	}
	// A tree past the bound is refused.
	big := t.TempDir()
	for i := 0; i <= MaxWatchEntries; i++ {
		os.WriteFile(filepath.Join(big, fmt.Sprint(i)), nil, 0o644)
	}
	bctx, bcancel := context.WithTimeout(context.Background(), 2*time.Minute) // the tree took a while
	defer bcancel()
	if err := c.Watch(bctx, big, false, nil, nil); !errdefs.IsResourceExhausted(err) {
		t.Fatalf("Watch of %d entries: got %v, want ResourceExhausted", MaxWatchEntries+1, err)
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// waitFor polls cond until it holds, failing after a generous deadline.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 20s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestSignalExitedExec: an exec that has exited but whose handler has not
// yet forgotten it (its result is already on the wire) is NotFound to every
// signal, SIGKILL too (TestExecStream's last check got a success once in a
// CI run: the client had the result before the entry went).
func TestSignalExitedExec(t *testing.T) {
	s, err := NewServer(Config{Token: testToken, LogDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	st := &execState{pid: 1 << 22, exited: true} // above pid_max: nothing to hit
	s.addExec(st)
	var buf bytes.Buffer
	for _, sig := range []int{9, 15} {
		if err := s.handleSignal(&frameWriter{w: &buf}, &request{Pid: st.pid, Signal: sig}); !errdefs.IsNotFound(err) {
			t.Errorf("signal %d to an exited exec: got %v, want NotFound", sig, err)
		}
	}
	if buf.Len() != 0 {
		t.Errorf("a result frame was written: %q", buf.Bytes())
	}
}
