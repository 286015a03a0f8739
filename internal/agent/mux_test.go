package agent

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/forkbox/forkbox/errdefs"
)

// Calls on one session run at once, each with its own flow control: large
// outputs, stdin and files cross it intact while other calls go on.
func TestSessionConcurrentStreams(t *testing.T) {
	c := NewSessionClient(startServer(t, Config{}).addr, testToken)
	defer c.Close()
	ctx := testCtx(t)
	data := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	var wg sync.WaitGroup
	errs := make(chan error, 24)
	for i := range 8 {
		wg.Add(3)
		go func() {
			defer wg.Done()
			var out bytes.Buffer
			res, err := c.Exec(ctx, ExecRequest{Argv: []string{"cat"}, Stdin: data}, &out, nil)
			if err != nil || res.ExitCode != 0 || !bytes.Equal(out.Bytes(), data) {
				errs <- fmt.Errorf("cat %d: %+v, %v, %d bytes back", i, res, err, out.Len())
			}
		}()
		go func() {
			defer wg.Done()
			p := fmt.Sprintf("%s/f%d", t.TempDir(), i)
			if err := c.WriteFile(ctx, p, data, 0o600); err != nil {
				errs <- err
				return
			}
			if got, err := c.ReadFile(ctx, p); err != nil || !bytes.Equal(got, data) {
				errs <- fmt.Errorf("read %s: %d bytes, %v", p, len(got), err)
			}
		}()
		go func() {
			defer wg.Done()
			if _, err := c.Ping(ctx); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	c.smu.Lock()
	n := 0
	if c.sess != nil {
		n = 1
	}
	c.smu.Unlock()
	if n != 1 {
		t.Errorf("got %d sessions after the calls, want 1", n)
	}
}

// Cancelling an exec on a session kills its process group and leaves the
// session to the other calls; a stream the client abandons does not stall
// the session even when the agent keeps writing to it.
func TestSessionCancelKillsAndSessionLives(t *testing.T) {
	c := startServer(t, Config{})
	ctx := testCtx(t)
	ectx, cancel := context.WithCancel(ctx)
	marker := fmt.Sprintf("cancel-marker-%d", time.Now().UnixNano())
	started := make(chan struct{})
	var once sync.Once
	w := writerFunc(func(p []byte) (int, error) {
		once.Do(func() { close(started) })
		return len(p), nil
	})
	done := make(chan error, 1)
	go func() {
		_, err := c.Exec(ectx, ExecRequest{Argv: []string{"yes", marker}}, w, nil)
		done <- err
	}()
	<-started
	cancel()
	if err := <-done; !errors.Is(err, errdefs.ErrCanceled) {
		t.Errorf("cancelled exec: got %v, want Canceled", err)
	}
	for range 20 {
		if _, err := c.Exec(ctx, ExecRequest{Argv: []string{"true"}}, nil, nil); err != nil {
			t.Fatalf("exec after the cancel: %v", err)
		}
	}
	// The kill follows the stream's close: wait for it.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		var out bytes.Buffer
		res, err := c.Exec(ctx, ExecRequest{Argv: []string{"pgrep", "-f", "^yes " + marker}}, &out, nil)
		if err != nil {
			t.Fatal(err)
		}
		if res.ExitCode == 1 { // none
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("yes still runs 10 s after the cancel: %q", out.String())
		}
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// A session ends with its agent; the next call dials a new one, to the
// agent started in its place.
func TestSessionReconnectsAfterAgentRestart(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	serve := func(ln net.Listener) (stop func()) {
		s, err := NewServer(Config{Token: testToken, LogDir: t.TempDir(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			s.Serve(ctx, ln)
		}()
		return func() { cancel(); <-done }
	}
	stop := serve(ln)
	c := NewSessionClient(addr, testToken)
	defer c.Close()
	ctx := testCtx(t)
	if _, err := c.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	stop()
	ln2, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer serve(ln2)()
	// The daemon waits for a restarted agent (WaitReady) before it calls:
	// its first ping may land on the old session, never a call after.
	if err := WaitReady(ctx, c); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(ctx, ExecRequest{Argv: []string{"true"}}, nil, nil); err != nil {
		t.Errorf("exec after the agent's restart: %v", err)
	}
}

// A session with a wrong token is refused with Unauthenticated; an agent
// without sessions (an older build) gets a connection per call.
func TestSessionTokenAndFallback(t *testing.T) {
	c := startServer(t, Config{})
	bad := NewSessionClient(c.addr, "wrong")
	defer bad.Close()
	if _, err := bad.Ping(testCtx(t)); !errdefs.IsUnauthenticated(err) {
		t.Errorf("session with a wrong token: got %v, want Unauthenticated", err)
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	defer ln.Close() // before the Wait
	wg.Add(1)
	go func() { // an agent that knows no "mux": NotImplemented, as dispatch answers
		defer wg.Done()
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			f, err := readFrame(bufio.NewReader(conn))
			var req request
			if err == nil {
				json.Unmarshal(f.payload, &req)
			}
			fw := &frameWriter{w: conn}
			if req.Op == opPing {
				fw.writeJSON(frameResult, PingInfo{Version: "old"})
			} else {
				fw.writeError(fmt.Errorf("unknown op %q: %w", req.Op, errdefs.ErrNotImplemented))
			}
			conn.Close()
		}
	}()
	old := NewSessionClient(ln.Addr().String(), testToken)
	for range 2 {
		if info, err := old.Ping(testCtx(t)); err != nil || info.Version != "old" {
			t.Errorf("ping an agent without sessions: got %+v, %v", info, err)
		}
	}
	old.Close()
}

// A fork notice ends the agent's other sessions (a restored agent's were
// its source's); the client of such a session dials a new one.
func TestForkNoticeEndsOtherSessions(t *testing.T) {
	c := startServer(t, Config{})
	ctx := testCtx(t)
	other := NewSessionClient(c.addr, testToken)
	defer other.Close()
	if _, err := other.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Forked(ctx, ForkNotice{Reason: ForkReasonFork, Token: "child"}); err != nil {
		t.Fatal(err)
	}
	// A notice on a connection of its own (as the daemon sends it) ends
	// every session, and new ones open.
	if _, err := NewClient(c.addr, "child").Forked(ctx, ForkNotice{Reason: ForkReasonWake}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		other.smu.Lock()
		alive := other.sess != nil && other.sess.alive()
		other.smu.Unlock()
		if !alive {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the other session is still open after the fork notice")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if _, err := other.Ping(ctx); !errdefs.IsUnauthenticated(err) {
		t.Errorf("new session with the source's token: got %v, want Unauthenticated", err)
	}
	if _, err := c.Ping(ctx); err != nil {
		t.Errorf("the notice's own session after it: %v", err)
	}
}

// A peer that breaks the session's rules (a frame over the size limit, data
// past the window, ids that do not grow) loses the session; nothing it sent
// is held beyond the window.
func TestSessionAbuse(t *testing.T) {
	c := startServer(t, Config{})
	frame := func(id uint32, kind byte, n int) []byte {
		b := make([]byte, muxHdrLen+n)
		binary.BigEndian.PutUint32(b, id)
		b[4] = kind
		binary.BigEndian.PutUint32(b[5:], uint32(n))
		return b
	}
	// An exec whose command reads no stdin, and stdin sent past the
	// window: the agent stops reading it, the peer sends on regardless.
	var inner bytes.Buffer
	(&frameWriter{w: &inner}).writeJSON(frameHeader, request{Token: testToken, Op: opExec, HasStdin: true,
		Exec: &ExecRequest{Argv: []string{"sleep", "30"}}})
	for range 32 {
		(&frameWriter{w: &inner}).write(frameData, streamStdin, make([]byte, chunkSize))
	}
	big := frame(1, muxOpen, 0)
	for b := inner.Bytes(); len(b) > 0; {
		n := min(len(b), muxMaxFrame)
		f := frame(1, muxData, 0)
		binary.BigEndian.PutUint32(f[5:], uint32(n))
		big = append(append(big, f...), b[:n]...)
		b = b[n:]
	}
	for name, abuse := range map[string][]byte{
		"oversized frame":   frame(0, muxPing, muxMaxFrame+1),
		"past the window":   append(frame(1, muxOpen, 0), big...),
		"id that goes back": append(frame(5, muxOpen, 0), frame(3, muxOpen, 0)...),
		"unknown kind":      frame(0, 'x', 0),
	} {
		t.Run(name, func(t *testing.T) {
			conn, err := net.Dial("tcp", c.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			fw := &frameWriter{w: conn}
			fw.writeJSON(frameHeader, request{Token: testToken, Op: opMux})
			br := bufio.NewReader(conn)
			if f, err := readFrame(br); err != nil || f.typ != frameResult {
				t.Fatalf("session header: %v", err)
			}
			conn.Write(abuse)
			conn.SetReadDeadline(time.Now().Add(10 * time.Second))
			_, err = io.Copy(io.Discard, br)
			if err != nil && !errors.Is(err, net.ErrClosed) && !strings.Contains(err.Error(), "reset") {
				t.Errorf("got %v, want the agent to close the session", err)
			}
		})
	}
}

// A session taken out of use (its ping was answered late: a loaded host,
// not a dead agent) lets the calls running on it finish, gives new calls a
// new session, and ends when its last call does; closing the client ends
// it at once.
func TestRetiredSessionKeepsCalls(t *testing.T) {
	for _, closeClient := range []bool{false, true} {
		c := NewSessionClient(startServer(t, Config{}).addr, testToken)
		ctx := testCtx(t)
		if _, err := c.Ping(ctx); err != nil {
			t.Fatal(err)
		}
		c.smu.Lock()
		old := c.sess
		c.smu.Unlock()
		// A call that runs until told: it reads its stdin to the end.
		pr, pw := io.Pipe()
		done := make(chan error, 1)
		var out bytes.Buffer
		started := make(chan struct{})
		go func() {
			res, err := c.ExecStream(ctx, ExecRequest{Argv: []string{"sh", "-c", "cat; echo end"}},
				ExecIO{Stdin: pr, Stdout: &out, Started: func(int) { close(started) }})
			if err == nil && res.ExitCode != 0 {
				err = fmt.Errorf("exit %d", res.ExitCode)
			}
			done <- err
		}()
		select {
		case <-started:
		case err := <-done:
			t.Fatalf("the call ended before it started: %v", err)
		}
		if _, err := pw.Write([]byte("first\n")); err != nil {
			t.Fatal(err)
		}
		c.smu.Lock()
		old.retire()
		c.retired = append(c.retired, old)
		c.sess = nil
		c.smu.Unlock()
		if !old.alive() {
			t.Fatal("a retired session with a call running ended")
		}
		if _, err := c.Ping(ctx); err != nil {
			t.Fatalf("a new call after the retire: %v", err)
		}
		c.smu.Lock()
		fresh := c.sess
		c.smu.Unlock()
		if fresh == nil || fresh == old {
			t.Fatalf("new calls still take the retired session")
		}
		if closeClient {
			c.Close()
			if err := <-done; err == nil {
				t.Error("a call on a retired session outlived its client")
			}
			if old.alive() {
				t.Error("the client is closed, its retired session is not")
			}
			continue
		}
		pw.Write([]byte("second\n"))
		pw.Close()
		if err := <-done; err != nil || out.String() != "first\nsecond\nend\n" {
			t.Errorf("the call on the retired session: %v, %q", err, out.String())
		}
		select {
		case <-old.done:
		case <-ctx.Done():
			t.Error("the retired session did not end with its last call")
		}
		c.Close()
	}
}

// A new session waits for an agent that answers slowly (a loaded host)
// longer than the connection's dial timeout: here 2.5 s, where the
// handshake was once bounded by the 2 s dial timeout and failed.
func TestSessionSlowHandshake(t *testing.T) {
	addr := fakeAgent(t, func(conn net.Conn, br *bufio.Reader) {
		time.Sleep(2500 * time.Millisecond) // the slow agent under test, not a wait for an outcome
		(&frameWriter{w: conn}).writeJSON(frameResult, struct{}{})
		io.Copy(io.Discard, br)
	})
	c := NewSessionClient(addr, testToken)
	defer c.Close()
	m, err := c.dialSession(testCtx(t), "test")
	if err != nil {
		t.Fatalf("a handshake answered in 2.5 s: %v", err)
	}
	m.Close()
}
