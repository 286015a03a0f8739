package daemon

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"io"
	"net"
	"os"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/agent"
	"github.com/forkbox/forkbox/internal/runtime/ocicli"
	"github.com/forkbox/forkbox/internal/store"
)

// A hostile agent: it speaks the protocol as an older agent does (no
// sessions, a connection per call), answers pings, and takes a request of
// op and never answers it, holding the connection open until the test ends.

type silentAgent struct {
	addr  string
	mu    sync.Mutex
	took  map[string]int // requests of each op it read
	tookc chan string    // each op it read, as it reads it
	ended chan string    // each silent op whose connection ended
}

// serveSilentAgent starts a hostile agent that never answers op.
func serveSilentAgent(t testing.TB, op string) *silentAgent {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := &silentAgent{addr: ln.Addr().String(), took: map[string]int{}, tookc: make(chan string, 64), ended: make(chan string, 64)}
	done := make(chan struct{})
	var wg sync.WaitGroup
	t.Cleanup(func() {
		close(done)
		ln.Close()
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
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				stop := context.AfterFunc(doneCtx(done), func() { c.Close() })
				defer stop()
				a.serve(c, op)
			}()
		}
	}()
	return a
}

func (a *silentAgent) serve(c net.Conn, silent string) {
	br := bufio.NewReader(c)
	var h [6]byte
	if _, err := io.ReadFull(br, h[:]); err != nil {
		return
	}
	body := make([]byte, binary.BigEndian.Uint32(h[2:]))
	if _, err := io.ReadFull(br, body); err != nil {
		return
	}
	var req struct {
		Op string `json:"op"`
	}
	_ = json.Unmarshal(body, &req)
	a.mu.Lock()
	a.took[req.Op]++
	a.mu.Unlock()
	notify(a.tookc, req.Op)
	switch req.Op {
	case silent:
		io.Copy(io.Discard, br) // until the caller or the test closes it
		notify(a.ended, req.Op)
	case "mux":
		writeTestFrame(c, 'E', map[string]string{"class": errdefs.ClassName(errdefs.ErrNotImplemented), "message": "no sessions here"})
	default:
		writeTestFrame(c, 'R', map[string]any{})
	}
}

// notify sends op on c unless c is full (nobody waits on it).
func notify(c chan string, op string) {
	select {
	case c <- op:
	default:
	}
}

func (a *silentAgent) count(op string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.took[op]
}

func writeTestFrame(w io.Writer, typ byte, v any) {
	b, _ := json.Marshal(v)
	f := append([]byte{typ, 0, 0, 0, 0, 0}, b...)
	binary.BigEndian.PutUint32(f[2:], uint32(len(b)))
	w.Write(f)
}

func doneCtx(done <-chan struct{}) context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	go func() { <-done; cancel() }()
	return ctx
}

// useAgent points sandbox id's fake container at addr.
func (h *harness) useAgent(id, addr string) {
	h.w.mu.Lock()
	defer h.w.mu.Unlock()
	h.w.ctr[id].addr = addr
}

// An agent that takes a token rotation and never answers does not hold
// its caller (who holds the sandbox's lock, with a context that cannot
// end) for longer than rotateTimeout: it fails DeadlineExceeded, and the
// recorded token stays the one the agent still takes.
func TestRotateTokenBounded(t *testing.T) {
	h := newHarness(t)
	id := h.create(CreateOptions{})
	sb := h.state(id)
	old := sb.AgentToken
	a := serveSilentAgent(t, "rotate")
	h.useAgent(id, a.addr)
	defer func(d time.Duration) { rotateTimeout = d }(rotateTimeout)
	rotateTimeout = 2 * time.Second // room for the dial and the refused session on a loaded host

	err := returnsWithin(t, "rotateAgentToken still waits on an agent that never answers",
		func() error { return h.d.rotateAgentToken(context.Background(), sb) })
	if !errdefs.IsDeadlineExceeded(err) {
		t.Errorf("rotate: %v, want DeadlineExceeded", err)
	}
	if n := a.count("rotate"); n > 1 {
		t.Errorf("the agent got %d rotations, want at most 1", n)
	}
	if got := h.state(id).AgentToken; got != old {
		t.Errorf("recorded token changed to %q after a failed rotation", got)
	}
}

// What the daemon keeps of what a sandbox wrote or said is bounded: the
// tail of its init's output (read without reading the rest), the signal
// name its agent reported.
func TestSandboxTextBounded(t *testing.T) {
	p := filepath.Join(t.TempDir(), "stdio.log")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	// 1 GiB, sparse but for its end: reading it all would be felt.
	if err := f.Truncate(1 << 30); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("last words"), 1<<30); err != nil {
		t.Fatal(err)
	}
	f.Close()
	var before, after goruntime.MemStats
	goruntime.ReadMemStats(&before)
	got := ocicli.Tail(p, 1024)
	goruntime.ReadMemStats(&after)
	if n := after.TotalAlloc - before.TotalAlloc; n > 1<<20 {
		t.Errorf("reading the tail allocated %d bytes: it read the whole file", n)
	}
	if len(got) != 1024 || !strings.HasSuffix(got, "last words") {
		t.Errorf("tail of %d bytes ending %q, want 1024 ending \"last words\"", len(got), got[max(0, len(got)-10):])
	}
	if got := ocicli.Tail(filepath.Join(t.TempDir(), "missing"), 1024); got != "" {
		t.Errorf("tail of a missing file: %q", got)
	}
	short := filepath.Join(t.TempDir(), "short")
	os.WriteFile(short, []byte("hi"), 0o644)
	if got := ocicli.Tail(short, 1024); got != "hi" {
		t.Errorf("tail of a short file: %q", got)
	}

	data := execFinished("ex-1", time.Now(), ExecResult{Signal: strings.Repeat("S", 1<<20)}, nil)
	if s, _ := data["signal"].(string); len(s) > 32 {
		t.Errorf("exec.finished keeps a signal name of %d bytes", len(s))
	}
}

// Writing a sandbox's credential files at its start is bounded: an agent
// that takes the write and never answers fails it DeadlineExceeded (a
// pool's refill runs it with a context that never ends).
func TestCredentialWriteBounded(t *testing.T) {
	h := newHarness(t)
	id := h.create(CreateOptions{})
	if _, err := h.d.SetCredential(context.Background(), id, CredentialSpec{Name: "key", File: "key"}, "s3cret"); err != nil {
		t.Fatal(err)
	}
	a := serveSilentAgent(t, "write")
	h.useAgent(id, a.addr)
	defer func(d time.Duration) { credentialWriteTimeout = d }(credentialWriteTimeout)
	credentialWriteTimeout = 2 * time.Second // room for the dial and the refused session on a loaded host

	err := returnsWithin(t, "writing credential files still waits on an agent that never answers",
		func() error { return h.d.injectCredentialFiles(context.Background(), h.state(id), false) })
	if !errdefs.IsDeadlineExceeded(err) {
		t.Errorf("credential files: %v, want DeadlineExceeded", err)
	}
	if n := a.count("write"); n > 1 {
		t.Errorf("the agent got %d writes, want at most 1", n)
	}
}

// A memory child whose agent takes the fork notice and never answers
// fails DeadlineExceeded once forkNoticeTimeout is over, instead of
// holding its fork (and a pool's refill) for ever.
func TestForkNoticeBounded(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	src := h.create(CreateOptions{Name: "src"})
	if _, err := h.d.Pause(ctx, src); err != nil {
		t.Fatal(err)
	}
	defer func(d time.Duration) { forkNoticeTimeout = d }(forkNoticeTimeout)
	forkNoticeTimeout = 2 * time.Second // room for the dial and the refused session on a loaded host
	h.w.mu.Lock()
	h.w.silentOp = "forked"
	h.w.mu.Unlock()

	var res *ForkResult
	err := returnsWithin(t, "the memory fork still waits on a child's agent that never answers its fork notice",
		func() (err error) {
			res, err = h.d.Fork(ctx, ForkOptions{Source: src, Count: 1, Memory: true})
			return err
		})
	if err != nil {
		t.Fatal(err)
	}
	if err := res.Children[0].Err; !errdefs.IsDeadlineExceeded(err) {
		t.Errorf("child: %v, want DeadlineExceeded", err)
	}
}

// An exec with a timeout ends within the timeout and execTimeoutGrace even
// when the agent ignores the timeout and never answers: DeadlineExceeded,
// and exec.finished says so.
func TestExecTimeoutKeptByDaemon(t *testing.T) {
	h := newHarness(t)
	id := h.create(CreateOptions{})
	a := serveSilentAgent(t, "exec")
	h.useAgent(id, a.addr)
	defer func(d time.Duration) { execTimeoutGrace = d }(execTimeoutGrace)
	execTimeoutGrace = 2 * time.Second // room for the dial and the refused session on a loaded host

	err := returnsWithin(t, "the exec still waits on an agent that ignores its timeout", func() error {
		_, err := h.d.Exec(context.Background(), id, ExecOptions{ExecRequest: agent.ExecRequest{Argv: []string{"sleep", "1000"}, Timeout: 100 * time.Millisecond}}, io.Discard, io.Discard)
		return err
	})
	if !errdefs.IsDeadlineExceeded(err) {
		t.Errorf("exec: %v, want DeadlineExceeded", err)
	}
	if evs := h.events(id); !slices.Contains(evs, store.EventExecFinished) {
		t.Errorf("ledger %v: want %s", evs, store.EventExecFinished)
	}
}

// returnsWithin runs call and returns its error, and fails t with hang when
// call has not returned within a minute: the hang these tests are about.
func returnsWithin(t *testing.T, hang string, call func() error) error {
	t.Helper()
	errc := make(chan error, 1)
	go func() { errc <- call() }()
	select {
	case err := <-errc:
		return err
	case <-time.After(time.Minute):
		t.Fatal(hang)
		return nil
	}
}
