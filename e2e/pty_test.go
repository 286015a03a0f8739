package e2e

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	v1 "github.com/forkbox/forkbox/api/forkbox/v1"
	"github.com/forkbox/forkbox/api/forkbox/v1/forkboxv1connect"
	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/errdefs"
)

// screen collects what a terminal prints; a test waits for text in it.
type screen struct {
	mu      sync.Mutex
	b       strings.Builder
	changed chan struct{}
}

func newScreen() *screen { return &screen{changed: make(chan struct{}, 1)} }

func (s *screen) write(p []byte) {
	s.mu.Lock()
	s.b.Write(p)
	s.mu.Unlock()
	select {
	case s.changed <- struct{}{}:
	default:
	}
}

func (s *screen) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// waitFor waits until the text after offset from matches re, and returns
// the offset past the match.
func (s *screen) waitFor(t *testing.T, from int, re string) int {
	t.Helper()
	rx := regexp.MustCompile(re)
	deadline := time.After(60 * time.Second)
	for {
		text := s.String()
		if loc := rx.FindStringIndex(text[min(from, len(text)):]); loc != nil {
			return from + loc[1]
		}
		select {
		case <-s.changed:
		case <-deadline:
			t.Fatalf("the terminal never printed %s; it printed %q", re, text)
		}
	}
}

// waitExec runs argv in sb until it succeeds (or fails, if not success),
// with a deadline.
func waitExec(t *testing.T, sb *client.Sandbox, success bool, argv ...string) {
	t.Helper()
	cmd := strings.Join(argv, " ")
	deadline := time.Now().Add(60 * time.Second)
	for {
		res, err := sb.Exec(context.Background(), client.ExecOptions{Argv: argv})
		if err != nil {
			t.Fatalf("exec %q: %v", cmd, err)
		}
		if (res.ExitCode == 0) == success {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%q: exit %d, want success=%v", cmd, res.ExitCode, success)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestPty drives a shell on a terminal through the Go SDK: the terminal's
// name and size, a resize, Ctrl-C of a foreground job, the exit code.
func TestPty(t *testing.T) {
	forEachRuntime(t, func(t *testing.T) {
		sb := newSandbox(t, clientOpts())
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		scr := newScreen()
		p, err := sb.Pty(ctx, client.PtyOptions{Command: []string{"sh"}, Env: map[string]string{"PS1": "$ "}, Rows: 30, Cols: 100, OnData: scr.write})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		typ := func(s string) {
			t.Helper()
			if err := p.SendInput([]byte(s)); err != nil {
				t.Fatal(err)
			}
		}
		typ("tty; stty size; echo one-$((1+1))\n")
		at := scr.waitFor(t, 0, `/dev/pts/[0-9]+\r\n30 100\r\none-2`)
		if err := p.Resize(40, 120); err != nil {
			t.Fatal(err)
		}
		typ("stty size; echo two-$((1+2))\n")
		at = scr.waitFor(t, at, `40 120\r\ntwo-3`)

		typ("sleep 100\n")
		waitExec(t, sb, true, "pidof", "sleep")
		typ("\x03")
		waitExec(t, sb, false, "pidof", "sleep")
		typ("echo rc=$?\n")
		at = scr.waitFor(t, at, `rc=130`)
		typ("echo alive-$((2+3))\n")
		scr.waitFor(t, at, `alive-5`)

		typ("exit 7\n")
		res, err := p.Wait()
		if err != nil {
			t.Fatal(err)
		}
		if res.ExitCode != 7 {
			t.Errorf("got exit %d signal %q, want 7", res.ExitCode, res.Signal)
		}
	})
}

// TestPtyKill: Kill ends the session, its jobs too; out-of-bounds sizes
// and oversized input are refused.
func TestPtyKillAndBounds(t *testing.T) {
	sb := newSandbox(t, clientOpts())
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if _, err := sb.Pty(ctx, client.PtyOptions{Command: []string{"sh"}, Rows: 1001, Cols: 80}); err == nil || !strings.Contains(err.Error(), "1001") {
		t.Errorf("rows 1001: got %v, want InvalidArgument", err)
	}
	p, err := sb.Pty(ctx, client.PtyOptions{Command: []string{"sh"}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	p.SendInput([]byte("sleep 100\n"))
	waitExec(t, sb, true, "pidof", "sleep")
	if err := p.Kill(); err != nil {
		t.Fatal(err)
	}
	res, err := p.Wait()
	if err != nil || res.Signal != "SIGKILL" {
		t.Errorf("got %+v, %v, want killed by SIGKILL", res, err)
	}
	waitExec(t, sb, false, "pidof", "sleep")
}

// TestPtyAPIAbuse speaks ExecPty directly, as a client that is not an SDK
// might: no start, an input message past the bound, a second start. Each
// is InvalidArgument, and the session it broke is killed.
func TestPtyAPIAbuse(t *testing.T) {
	sb := newSandbox(t, clientOpts())
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	hc := &http.Client{Transport: &http.Transport{Protocols: &p, DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", env.socket)
	}}}
	svc := forkboxv1connect.NewSandboxServiceClient(hc, "http://forkbox")
	start := &v1.PtyRequest{Event: &v1.PtyRequest_Start{Start: &v1.PtyStart{Sandbox: sb.ID, Argv: []string{"sh"}}}}
	for _, tc := range []struct {
		name string
		msgs []*v1.PtyRequest
	}{
		{"input first", []*v1.PtyRequest{{Event: &v1.PtyRequest_Input{Input: []byte("ls\n")}}}},
		{"oversized input", []*v1.PtyRequest{start, {Event: &v1.PtyRequest_Input{Input: bytes.Repeat([]byte("x"), 64<<10+1)}}}},
		{"second start", []*v1.PtyRequest{start, start}},
		{"resize too large", []*v1.PtyRequest{start, {Event: &v1.PtyRequest_Resize{Resize: &v1.PtySize{Rows: 5000, Cols: 80}}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			stream := svc.ExecPty(ctx)
			for _, m := range tc.msgs {
				if err := stream.Send(m); err != nil && !errors.Is(err, io.EOF) {
					t.Fatal(err)
				}
			}
			var err error
			for {
				var msg *v1.PtyResponse
				if msg, err = stream.Receive(); err != nil {
					break
				}
				if msg.GetExit() != nil {
					t.Fatalf("got exit %v, want an InvalidArgument error", msg.GetExit())
				}
			}
			if connect.CodeOf(err) != connect.CodeInvalidArgument {
				t.Errorf("got %v, want InvalidArgument", err)
			}
			stream.CloseRequest()
			stream.CloseResponse()
		})
	}
	waitExec(t, sb, false, "pidof", "sh")
}

// tmux runs tmux on this test's own server socket (a path: a server of an
// earlier test that is still going away is never reused).
func tmux(t *testing.T, sock string, args ...string) string {
	t.Helper()
	out, err := exec.Command("tmux", append([]string{"-S", sock, "-f", "/dev/null"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("tmux %v: %v\n%s", args, err, out)
	}
	return string(out)
}

// TestPtyCLI drives `forkbox exec -it` in a real terminal (a tmux pane):
// the size inside follows the pane's, also after a resize, and the CLI
// exits with the remote exit code.
func TestPtyCLI(t *testing.T) {
	if _, err := exec.LookPath("tmux"); err != nil {
		t.Skip("needs tmux")
	}
	sb := newSandbox(t, clientOpts())
	sock := filepath.Join(t.TempDir(), "tmux.sock")
	t.Cleanup(func() { exec.Command("tmux", "-S", sock, "kill-server").Run() })
	// The pane's shell runs the CLI, then prints its exit status and whether
	// the terminal's settings are back as they were.
	cli := `before=$(stty -g); ` + env.bin + " --host unix://" + env.socket + " exec -it --env 'PS1=$ ' " + sb.ID +
		` -- sh; echo CLI-EXIT=$?; [ "$(stty -g)" = "$before" ] && echo TTY-RESTORED`
	tmux(t, sock, "start-server", ";", "set-option", "-g", "remain-on-exit", "on", ";", "set-option", "-g", "status", "off", ";",
		"new-session", "-d", "-s", "pty", "-x", "100", "-y", "30", cli)
	pane := func() string { return tmux(t, sock, "capture-pane", "-p", "-t", "pty") }
	waitPane := func(re string) {
		t.Helper()
		rx := regexp.MustCompile(re)
		deadline := time.Now().Add(60 * time.Second)
		for !rx.MatchString(pane()) {
			if time.Now().After(deadline) {
				t.Fatalf("the pane never showed %s; it shows:\n%s", re, pane())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	size := func() string {
		return strings.TrimSpace(tmux(t, sock, "display-message", "-p", "-t", "pty", "#{pane_height} #{pane_width}"))
	}

	waitPane(`(?m)^\$`) // capture-pane drops trailing spaces
	want := size()
	tmux(t, sock, "send-keys", "-t", "pty", "stty size; echo one-$((1+1))", "Enter")
	waitPane(`(?m)^` + want + `\none-2$`)

	tmux(t, sock, "resize-window", "-t", "pty", "-x", "120", "-y", "40")
	want2 := size()
	if want2 == want {
		t.Fatalf("tmux kept the pane at %s after resize-window", want)
	}
	// The CLI sends the new size when its terminal tells it, apart from
	// the keys: the shell waits (30 s at most) until it has it.
	tmux(t, sock, "send-keys", "-t", "pty", `for i in $(seq 300); do [ "$(stty size)" = "`+want2+`" ] && break; sleep 0.1; done; stty size; echo two-$((1+2))`, "Enter")
	waitPane(`(?m)^` + want2 + `\ntwo-3$`)

	// Ctrl-C goes to the job inside, not to the CLI.
	tmux(t, sock, "send-keys", "-t", "pty", "sleep 100", "Enter")
	waitExec(t, sb, true, "pidof", "sleep")
	tmux(t, sock, "send-keys", "-t", "pty", "C-c")
	waitExec(t, sb, false, "pidof", "sleep")
	tmux(t, sock, "send-keys", "-t", "pty", "echo rc=$?", "Enter")
	waitPane(`(?m)^rc=130$`)

	tmux(t, sock, "send-keys", "-t", "pty", "exit 3", "Enter")
	waitPane(`(?m)^CLI-EXIT=3\nTTY-RESTORED$`)
}

// TestPtyOverTCP: ExecPty over the TCP listener (h2c), which needs the token.
func TestPtyOverTCP(t *testing.T) {
	addr := freeAddr(t)
	withDaemonFlags(t, "--tcp", addr, "--api-token", "s3cret")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c := &client.Client{URL: "http://" + addr, Token: "s3cret"}
	o := clientOpts()
	sb, err := c.CreateSandbox(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close(context.Background())
	scr := newScreen()
	p, err := sb.Pty(ctx, client.PtyOptions{Shell: "stty size; echo $((6*7))", Rows: 12, Cols: 34, OnData: scr.write})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	res, err := p.Wait()
	if err != nil || res.ExitCode != 0 || !strings.Contains(scr.String(), "12 34\r\n42\r\n") {
		t.Errorf("got %+v, %v, output %q; want exit 0 and \"12 34\", \"42\"", res, err, scr.String())
	}
	anon := &client.Client{URL: "http://" + addr}
	asb, err := anon.Sandbox(ctx, sb.ID)
	if err == nil {
		_, err = asb.Pty(ctx, client.PtyOptions{Shell: "true"})
	}
	if !errdefs.IsUnauthenticated(err) {
		t.Errorf("no token: got %v, want Unauthenticated", err)
	}
}

// TestPtySessionCap fills a sandbox's terminal sessions from one client:
// one more is refused with ResourceExhausted, closing a live one (a shell
// still running) returns at once and frees its slot for a new session.
func TestPtySessionCap(t *testing.T) {
	opts := clientOpts()
	opts.Runtime = "crun" // the cap is the daemon's; one runtime shows it
	sb := newSandbox(t, opts)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	open := func() (*client.Pty, error) {
		return sb.Pty(ctx, client.PtyOptions{Command: []string{"sh"}})
	}
	var ptys []*client.Pty
	defer func() {
		for _, p := range ptys {
			p.Close()
		}
	}()
	for i := 0; i < 16; i++ {
		p, err := open()
		if err != nil {
			t.Fatalf("session %d: %v", i+1, err)
		}
		ptys = append(ptys, p)
	}
	if p, err := open(); !errdefs.IsResourceExhausted(err) {
		if p != nil {
			p.Close()
		}
		t.Fatalf("17th session: got %v, want ResourceExhausted", err)
	}
	closed := make(chan error, 1)
	go func() { closed <- ptys[3].Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Errorf("close a live session: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("closing a live session with 16 open did not return")
	}
	ptys = append(ptys[:3], ptys[4:]...)
	// The slot is freed once the daemon has seen the session end: a new
	// session may be refused a moment, never for long.
	deadline := time.Now().Add(60 * time.Second)
	for {
		p, err := open()
		if err == nil {
			ptys = append(ptys, p)
			break
		}
		if !errdefs.IsResourceExhausted(err) || time.Now().After(deadline) {
			t.Fatalf("a session after one was closed: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
