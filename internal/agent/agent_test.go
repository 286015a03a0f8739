package agent

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/forkbox/forkbox/errdefs"
)

const testToken = "s3cret-token"

// startServer runs a non-init agent on 127.0.0.1:0 until the test ends.
func startServer(tb testing.TB, cfg Config) *Client {
	tb.Helper()
	_, c := startServerWith(tb, cfg)
	return c
}

// startServerWith is startServer, also returning the server.
func startServerWith(tb testing.TB, cfg Config) (*Server, *Client) {
	tb.Helper()
	if cfg.Token == "" {
		cfg.Token = testToken
	}
	if cfg.LogDir == "" {
		cfg.LogDir = tb.TempDir()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	s, err := NewServer(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.Serve(ctx, ln)
	}()
	c := newTestClient(ln.Addr().String(), cfg.Token)
	tb.Cleanup(func() {
		c.Close()
		s.signalExecs(9)
		cancel()
		<-done
	})
	return s, c
}

// newTestClient is the client the tests use: one whose calls share a
// session (as the daemon's), or with FORKBOX_AGENT_TEST_CLIENT=conn one
// that opens a connection per call.
func newTestClient(addr, token string) *Client {
	if os.Getenv("FORKBOX_AGENT_TEST_CLIENT") == "conn" {
		return NewClient(addr, token)
	}
	return NewSessionClient(addr, token)
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestPingAndSync(t *testing.T) {
	c := startServer(t, Config{})
	ctx := testCtx(t)
	if err := WaitReady(ctx, c); err != nil {
		t.Fatal(err)
	}
	info, err := c.Ping(ctx)
	if err != nil {
		t.Fatal(err)
	}
	host, _ := os.Hostname()
	if info.Version != Version || info.Hostname != host {
		t.Errorf("got %+v, want version %s hostname %s", info, Version, host)
	}
	if err := c.Sync(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestBadToken(t *testing.T) {
	c := startServer(t, Config{})
	bad := NewClient(c.addr, "wrong")
	ctx := testCtx(t)
	if _, err := bad.Ping(ctx); !errdefs.IsUnauthenticated(err) {
		t.Errorf("Ping with bad token: got %v, want Unauthenticated", err)
	}
	if _, err := bad.Exec(ctx, ExecRequest{Argv: []string{"/bin/true"}}, nil, nil); !errdefs.IsUnauthenticated(err) {
		t.Errorf("Exec with bad token: got %v, want Unauthenticated", err)
	}
	if err := WaitReady(ctx, bad); !errdefs.IsUnauthenticated(err) {
		t.Errorf("WaitReady with bad token: got %v, want Unauthenticated", err)
	}
}

func TestWaitReadyUnavailable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := WaitReady(ctx, NewClient(addr, testToken)); !errdefs.IsUnavailable(err) {
		t.Errorf("got %v, want Unavailable", err)
	}
}

// An agent that answers every ping, but each only after 600 ms (a loaded
// host), is found ready: each attempt that WaitReady's bound cut doubles
// the next one's (it was a fixed 250 ms, and no attempt could succeed).
func TestWaitReadySlowAgent(t *testing.T) {
	addr := fakeAgent(t, func(conn net.Conn, _ *bufio.Reader) {
		time.Sleep(600 * time.Millisecond) // the slow agent under test, not a wait for an outcome
		(&frameWriter{w: conn}).writeJSON(frameResult, PingInfo{})
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := WaitReady(ctx, NewClient(addr, testToken)); err != nil {
		t.Fatalf("an agent answering in 600 ms: %v", err)
	}
}

func TestExecExitCodes(t *testing.T) {
	c := startServer(t, Config{})
	ctx := testCtx(t)
	for _, tc := range []struct {
		name string
		req  ExecRequest
		code int
		sig  string
	}{
		{"true", ExecRequest{Argv: []string{"true"}}, 0, ""},
		{"exit3", ExecRequest{Shell: "exit 3"}, 3, ""},
		{"sigkill", ExecRequest{Shell: "kill -KILL $$"}, 137, "SIGKILL"},
		{"sigterm", ExecRequest{Shell: "kill -TERM $$"}, 143, "SIGTERM"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := c.Exec(ctx, tc.req, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			if res.ExitCode != tc.code || res.Signal != tc.sig || res.Pid <= 0 {
				t.Errorf("got exit %d signal %q pid %d, want exit %d signal %q", res.ExitCode, res.Signal, res.Pid, tc.code, tc.sig)
			}
		})
	}
}

func TestExecErrors(t *testing.T) {
	c := startServer(t, Config{})
	ctx := testCtx(t)
	for _, tc := range []struct {
		name  string
		req   ExecRequest
		class error
	}{
		{"empty", ExecRequest{}, errdefs.ErrInvalidArgument},
		{"missing binary", ExecRequest{Argv: []string{"no-such-binary-xyz"}}, errdefs.ErrNotFound},
		{"missing cwd", ExecRequest{Argv: []string{"true"}, Cwd: "/no/such/dir"}, errdefs.ErrNotFound},
		{"relative cwd", ExecRequest{Argv: []string{"true"}, Cwd: "tmp"}, errdefs.ErrInvalidArgument},
		{"bad env", ExecRequest{Argv: []string{"true"}, Env: map[string]string{"A=B": "x"}}, errdefs.ErrInvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := c.Exec(ctx, tc.req, nil, nil)
			if errdefs.Class(err) != tc.class {
				t.Errorf("got %v (class %s), want class %s", err, errdefs.ClassName(err), errdefs.ClassName(tc.class))
			}
		})
	}
}

func TestExecOutputStdinEnvCwd(t *testing.T) {
	c := startServer(t, Config{Env: []string{"FORKBOX_AGENT_TOKEN=leak", "KEEP=base", "OVER=base"}})
	ctx := testCtx(t)
	var out, errb bytes.Buffer
	res, err := c.Exec(ctx, ExecRequest{
		Shell: `echo out1; echo err1 >&2; cat; pwd; echo "$KEEP $OVER $NEW $HOME $PATH"; env | grep -c FORKBOX_ || true`,
		Env:   map[string]string{"OVER": "req", "NEW": "new"},
		Cwd:   "/tmp",
		Stdin: []byte("from-stdin\n"),
	}, &out, &errb)
	if err != nil {
		t.Fatal(err)
	}
	want := "out1\nfrom-stdin\n/tmp\nbase req new /root " + defaultPath + "\n0\n"
	if out.String() != want || errb.String() != "err1\n" || res.ExitCode != 0 {
		t.Errorf("got stdout %q stderr %q exit %d, want stdout %q stderr %q exit 0", out.String(), errb.String(), res.ExitCode, want, "err1\n")
	}
}

func TestExecLargeStdin(t *testing.T) {
	c := startServer(t, Config{})
	ctx := testCtx(t)
	in := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	var out bytes.Buffer
	if _, err := c.Exec(ctx, ExecRequest{Argv: []string{"cat"}, Stdin: in}, &out, nil); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out.Bytes(), in) {
		t.Errorf("got %d bytes back, want %d", out.Len(), len(in))
	}
}

// gateWriter collects what it is given and makes the file gate once it has
// been given anything.
type gateWriter struct {
	mu   sync.Mutex
	buf  strings.Builder
	gate string
}

func (w *gateWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.buf.Len() == 0 {
		os.WriteFile(w.gate, nil, 0o600)
	}
	w.buf.Write(p)
	return len(p), nil
}

// TestExecStreams: output reaches the caller while the command runs. The
// command waits (30 s at most) for a file that the caller makes when the
// first output reaches it, and says whether it came.
func TestExecStreams(t *testing.T) {
	c := startServer(t, Config{})
	ctx := testCtx(t)
	out := &gateWriter{gate: filepath.Join(t.TempDir(), "gate")}
	res, err := c.Exec(ctx, ExecRequest{Shell: "echo first; for i in $(seq 1500); do [ -e " + out.gate + " ] && break; sleep 0.02; done; [ -e " + out.gate + " ] && echo streamed || echo buffered"}, out, nil)
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("exec: %+v, %v", res, err)
	}
	if got := out.buf.String(); got != "first\nstreamed\n" {
		t.Fatalf("got stdout %q, want %q: the first line reached the caller only once the command ended", got, "first\nstreamed\n")
	}
	if res.Duration <= 0 {
		t.Errorf("got duration %v", res.Duration)
	}
}

func TestExecTimeout(t *testing.T) {
	c := startServer(t, Config{})
	ctx := testCtx(t)
	start := time.Now()
	// The child sleep is in the same process group and must die too.
	res, err := c.Exec(ctx, ExecRequest{Shell: "sleep 30 & sleep 30", Timeout: 200 * time.Millisecond}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !res.TimedOut || res.Signal != "SIGKILL" || res.ExitCode != 137 {
		t.Errorf("got %+v, want timed out by SIGKILL", res)
	}
	if d := time.Since(start); d > 20*time.Second {
		t.Errorf("exec took %v: the 200 ms timeout waited for the 30 s sleeps", d)
	}
}

func TestExecCancel(t *testing.T) {
	c := startServer(t, Config{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dir := t.TempDir()
	// The context ends once the command has written its pid.
	execErr := make(chan error, 1)
	go func() {
		_, err := c.Exec(ctx, ExecRequest{Shell: "echo $$ > " + dir + "/pid.tmp; mv " + dir + "/pid.tmp " + dir + "/pid; exec sleep 30"}, nil, nil)
		execErr <- err
	}()
	waitFor(t, func() bool { _, err := os.Stat(dir + "/pid"); return err == nil })
	cancel()
	if err := <-execErr; !errors.Is(err, errdefs.ErrCanceled) {
		t.Fatalf("got %v, want Canceled", err)
	}
	b, err := os.ReadFile(dir + "/pid")
	if err != nil {
		t.Fatal(err)
	}
	pid := strings.TrimSpace(string(b))
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := os.Stat("/proc/" + pid); os.IsNotExist(err) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %s still alive after the exec's context ended", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestStartBackground: Start returns while its command still runs (the
// command waits for a file the test makes after Start returned), and the
// command's output goes to its log.
func TestStartBackground(t *testing.T) {
	logDir := t.TempDir()
	c := startServer(t, Config{LogDir: logDir})
	ctx := testCtx(t)
	gate := filepath.Join(t.TempDir(), "gate")
	pid, err := c.Start(ctx, ExecRequest{Shell: "echo bg-out; echo bg-err >&2; while [ ! -e " + gate + " ]; do sleep 0.02; done; echo done"})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	logPath := logDir + "/exec-" + itoa(pid) + ".log"
	deadline := time.Now().Add(30 * time.Second)
	for {
		b, _ := os.ReadFile(logPath)
		if string(b) == "bg-out\nbg-err\ndone\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("log %s: got %q, want bg-out, bg-err, done", logPath, b)
		}
		time.Sleep(20 * time.Millisecond) // polling a file the command writes
	}
}
