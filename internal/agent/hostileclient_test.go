package agent

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/forkbox/forkbox/errdefs"
)

// A hostile agent against the host's client: serveRaw runs fn for every
// connection after reading its header frame, and closes the connection
// when fn returns or the test ends; done is closed when the test ends.
func serveRaw(t *testing.T, fn func(c net.Conn, br *bufio.Reader, req request, done <-chan struct{})) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	done := make(chan struct{})
	t.Cleanup(func() {
		close(done)
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				br := bufio.NewReader(c)
				f, err := readFrame(br)
				if err != nil {
					return
				}
				var req request
				if json.Unmarshal(f.payload, &req) != nil {
					return
				}
				fn(c, br, req, done)
			}()
		}
	}()
	return ln.Addr().String()
}

// An agent that streams directory entries past MaxListEntries is cut off
// there: ResourceExhausted, the connection closed after about the bound,
// not a daemon holding all it sent.
func TestListFilesBounded(t *testing.T) {
	const batch, batches = 10_000, 10 * MaxListEntries / 10_000 // ten times the bound
	ents := make([]FileInfo, batch)
	for i := range ents {
		ents[i] = FileInfo{Name: "f"}
	}
	payload, _ := json.Marshal(ents)
	sent := make(chan int, 1)
	addr := serveRaw(t, func(c net.Conn, _ *bufio.Reader, _ request, _ <-chan struct{}) {
		fw := &frameWriter{w: c}
		n := 0
		defer func() { sent <- n }()
		for ; n < batches; n++ {
			if fw.write(frameData, streamStdin, payload) != nil {
				return // the client stopped reading
			}
		}
		fw.writeJSON(frameResult, listResult{})
	})
	got, err := NewClient(addr, "tok").ListFiles(context.Background(), "/")
	if !errdefs.IsResourceExhausted(err) {
		t.Fatalf("ListFiles: %d entries, err %v; want ResourceExhausted", len(got), err)
	}
	// The client stopped at the bound: the agent could not write all
	// its batches (ten times the bound; socket buffers hold a few).
	if n := <-sent; n == batches {
		t.Errorf("the agent wrote all %d batches: the client read past the bound", n)
	}

	// All in the result frame (an agent that does not stream): the same.
	big := make([]FileInfo, MaxListEntries+1)
	addr = serveRaw(t, func(c net.Conn, _ *bufio.Reader, _ request, _ <-chan struct{}) {
		(&frameWriter{w: c}).writeJSON(frameResult, listResult{Entries: big})
	})
	if _, err := NewClient(addr, "tok").ListFiles(context.Background(), "/"); !errdefs.IsResourceExhausted(err) {
		t.Fatalf("ListFiles of a result with %d entries: %v; want ResourceExhausted", len(big), err)
	}
}

// endlessStdin is a stdin that never ends until it is closed.
type endlessStdin struct {
	mu     sync.Mutex
	closed bool
}

func (e *endlessStdin) Read(p []byte) (int, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return 0, io.EOF
	}
	return len(p), nil
}

func (e *endlessStdin) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.closed = true
	return nil
}

// An exec whose agent answers while never reading its stdin returns with
// the result: the stdin writer, blocked on a full connection, does not
// keep it.
func TestExecStreamStdinNotRead(t *testing.T) {
	addr := serveRaw(t, func(c net.Conn, _ *bufio.Reader, _ request, done <-chan struct{}) {
		fw := &frameWriter{w: c}
		fw.writeJSON(frameStarted, startResult{Pid: 7})
		fw.writeJSON(frameResult, ExecResult{Pid: 7, ExitCode: 3})
		<-done // holds the connection, reads nothing, until the test ends
	})
	type out struct {
		res ExecResult
		err error
	}
	done := make(chan out, 1)
	go func() {
		res, err := NewClient(addr, "tok").ExecStream(context.Background(), ExecRequest{Argv: []string{"x"}}, ExecIO{Stdin: &endlessStdin{}})
		done <- out{res, err}
	}()
	select {
	case o := <-done:
		if o.err != nil || o.res.ExitCode != 3 {
			t.Fatalf("ExecStream: %+v, %v; want exit code 3", o.res, o.err)
		}
	case <-time.After(time.Minute): // the hang this test is about
		t.Fatal("ExecStream still waits after its result, on a stdin nobody reads")
	}
}

// What an agent says is kept by the host (the ledger, replies) only up to
// a bound: an error's message, a fork hook's output.
func TestAgentTextBounded(t *testing.T) {
	huge := strings.Repeat("é", 300<<10) // 600 KiB of two-byte runes
	addr := serveRaw(t, func(c net.Conn, _ *bufio.Reader, req request, _ <-chan struct{}) {
		fw := &frameWriter{w: c}
		switch req.Op {
		case opFork:
			fw.writeJSON(frameResult, ForkReply{HookRan: true, HookOutput: huge + "the end"})
		default:
			fw.writeJSON(frameError, wireError{Class: "NotFound", Message: huge})
		}
	})
	c := NewClient(addr, "tok")
	_, err := c.Stat(context.Background(), "/x")
	if !errdefs.IsNotFound(err) {
		t.Fatalf("stat: %v, want NotFound", err)
	}
	if n := len(err.Error()); n > maxErrorMessage+100 {
		t.Errorf("error message of %d bytes kept, want at most about %d", n, maxErrorMessage)
	}
	if !utf8.ValidString(err.Error()) {
		t.Error("clipped error message is not valid UTF-8")
	}
	reply, err := c.Forked(context.Background(), ForkNotice{})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(reply.HookOutput); n > MaxHookOutput || !strings.HasSuffix(reply.HookOutput, "the end") || !utf8.ValidString(reply.HookOutput) {
		t.Errorf("hook output of %d bytes (ends %q), want its valid tail of at most %d", n, reply.HookOutput[max(0, n-10):], MaxHookOutput)
	}
}

// Once a terminal session's result is in, input still being sent to an
// agent that reads none fails instead of blocking its sender (the API's
// reader, which the session's end waits for).
func TestPtyInputAfterResult(t *testing.T) {
	addr := serveRaw(t, func(c net.Conn, _ *bufio.Reader, _ request, done <-chan struct{}) {
		fw := &frameWriter{w: c}
		fw.writeJSON(frameStarted, startResult{Pid: 9})
		fw.writeJSON(frameResult, ExecResult{Pid: 9})
		<-done // reads nothing, until the test ends
	})
	p, err := NewClient(addr, "tok").Pty(context.Background(), ExecRequest{Argv: []string{"sh"}}, PtySize{Rows: 24, Cols: 80})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	sent := make(chan error, 1)
	go func() {
		big := make([]byte, 64<<20) // more than any socket buffer holds
		sent <- p.Input(big)
	}()
	if _, err := p.Wait(nil); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-sent:
		if err == nil {
			t.Error("64 MiB of input to an agent that reads none went through")
		}
	case <-time.After(time.Minute): // the hang this test is about
		t.Fatal("input to an agent that reads none still blocks after the session's result")
	}
}
