package e2e

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	v1 "github.com/forkbox/forkbox/api/forkbox/v1"
	"github.com/forkbox/forkbox/api/forkbox/v1/forkboxv1connect"
	"github.com/forkbox/forkbox/client"
)

// ptyService is an ExecPty client on the daemon's socket (HTTP/2), and its
// transport's CloseIdleConnections.
func ptyService() (forkboxv1connect.SandboxServiceClient, func()) {
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	tr := &http.Transport{Protocols: &p, DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", env.socket)
	}}
	return forkboxv1connect.NewSandboxServiceClient(&http.Client{Transport: tr}, "http://forkbox"), tr.CloseIdleConnections
}

// daemonFDs counts the daemon's open fds.
func daemonFDs(t *testing.T) int {
	t.Helper()
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", env.daemon.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	return len(fds)
}

// waitFinished waits until the ledger of sb has exec.finished for execID
// and returns its data.
func waitFinished(t *testing.T, sb *client.Sandbox, execID string, within time.Duration) map[string]any {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		evs, err := sb.Events(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range evs {
			if e.Type == "exec.finished" && e.Data["exec_id"] == execID {
				return e.Data
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no exec.finished for %s within %v; ledger %v", execID, within, types(evs))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestPtyStalledClient: a client starts a terminal that prints without end
// and never reads its output. Within the stall timeout the session is
// killed, exec.finished records a ResourceExhausted error, and the daemon's
// goroutines and fds return to what they were.
func TestPtyStalledClient(t *testing.T) {
	const stall = 3 * time.Second
	maddr := freeAddr(t)
	withDaemonFlags(t, "--pty-stall-timeout", stall.String(), "--metrics", maddr)
	forEachRuntime(t, func(t *testing.T) {
		sb := newSandbox(t, clientOpts())
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		// One whole pty exec first, so that what the daemon makes once is
		// made before the count.
		warm, err := sb.Pty(ctx, client.PtyOptions{Command: []string{"true"}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := warm.Wait(); err != nil {
			t.Fatal(err)
		}
		warm.Close()
		// The standby runsc processes refill after the sandbox's create,
		// each with its socket and pidfd in the daemon: counted settled.
		standbySettled(t, maddr)
		goroutines := scrape(t, "http://"+maddr+"/metrics", "")["go_goroutines"]
		fds := daemonFDs(t)

		svc, closeIdle := ptyService()
		sctx, scancel := context.WithCancel(ctx)
		defer scancel()
		stream := svc.ExecPty(sctx)
		// Random bytes: gzip on the stream must not make them small.
		if err := stream.Send(&v1.PtyRequest{Event: &v1.PtyRequest_Start{Start: &v1.PtyStart{Sandbox: sb.ID, Argv: []string{"cat", "/dev/urandom"}}}}); err != nil {
			t.Fatal(err)
		}
		msg, err := stream.Receive()
		if err != nil || msg.GetStarted() == nil {
			t.Fatalf("got %v, %v; want started", msg, err)
		}
		start := time.Now()
		// ... and never read again.
		fin := waitFinished(t, sb, msg.GetStarted().ExecId, stall+2*time.Minute)
		took := time.Since(start)
		t.Logf("session of a client that does not read ended after %v: %v", took.Round(time.Millisecond), fin)
		if e, _ := fin["error"].(string); !strings.Contains(e, "resource exhausted") {
			t.Errorf("exec.finished: %v, want a resource exhausted error", fin)
		}
		waitExec(t, sb, false, "pidof", "cat")
		stream.CloseRequest()
		stream.CloseResponse()
		scancel()
		deadline := time.Now().Add(60 * time.Second)
		for {
			closeIdle()
			m := scrape(t, "http://"+maddr+"/metrics", "")
			g, f := m["go_goroutines"], daemonFDs(t)
			// Slack of 2 goroutines for the daemon's own comings and goings;
			// a held session keeps at least its handler, its reader and
			// the agent connection's fd.
			if g <= goroutines+2 && f <= fds && m["forkbox_runsc_standby_pending"] == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("daemon goroutines %v (before %v), fds %d (before %d)", g, goroutines, f, fds)
			}
			time.Sleep(100 * time.Millisecond)
		}
		// The sandbox is not held busy: a new session starts and ends.
		res, err := sb.Pty(ctx, client.PtyOptions{Command: []string{"true"}})
		if err != nil {
			t.Fatal(err)
		}
		if r, err := res.Wait(); err != nil || r.ExitCode != 0 {
			t.Errorf("pty after the stall: %+v, %v", r, err)
		}
		res.Close()
	})
}

// TestPtySessionBounds: at most 16 pty sessions at once on a sandbox (the
// 17th is ResourceExhausted, and one that ended frees its slot); a session
// whose caller goes away at once is still recorded as finished.
func TestPtySessionBounds(t *testing.T) {
	sb := newSandbox(t, clientOpts())
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var open []*client.Pty
	end := func(p *client.Pty) {
		p.Kill()
		p.Wait()
		p.Close()
	}
	defer func() {
		for _, p := range open {
			end(p)
		}
	}()
	for i := 0; i < 16; i++ {
		p, err := sb.Pty(ctx, client.PtyOptions{Command: []string{"sh"}})
		if err != nil {
			t.Fatalf("session %d: %v", i+1, err)
		}
		open = append(open, p)
	}
	if p, err := sb.Pty(ctx, client.PtyOptions{Command: []string{"sh"}}); err == nil {
		end(p)
		t.Fatal("a 17th pty session started")
	} else if !strings.Contains(err.Error(), "resource exhausted") {
		t.Errorf("17th session: got %v, want ResourceExhausted", err)
	}
	end(open[0])
	open = open[1:]
	deadline := time.Now().Add(60 * time.Second)
	for {
		p, err := sb.Pty(ctx, client.PtyOptions{Command: []string{"sh"}})
		if err == nil {
			open = append(open, p)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after one session ended: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, p := range open {
		end(p)
	}
	open = nil

	// Callers that go away right after the start: every exec.started gets
	// its exec.finished.
	svc, closeIdle := ptyService()
	defer closeIdle()
	for i := 0; i < 5; i++ {
		sctx, scancel := context.WithCancel(ctx)
		stream := svc.ExecPty(sctx)
		stream.Send(&v1.PtyRequest{Event: &v1.PtyRequest_Start{Start: &v1.PtyStart{Sandbox: sb.ID, Argv: []string{"sh"}}}})
		stream.CloseRequest()
		scancel()
		stream.CloseResponse()
	}
	deadline = time.Now().Add(60 * time.Second)
	for {
		evs, err := sb.Events(ctx)
		if err != nil {
			t.Fatal(err)
		}
		running := map[any]bool{}
		for _, e := range evs {
			switch e.Type {
			case "exec.started":
				running[e.Data["exec_id"]] = true
			case "exec.finished":
				delete(running, e.Data["exec_id"])
			}
		}
		if len(running) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("execs started and never finished: %v", running)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// standbySettled waits (bounded) until every standby runsc slot of the
// daemon serving metrics at maddr has a standby ready.
func standbySettled(t *testing.T, maddr string) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		m := scrape(t, "http://"+maddr+"/metrics", "")
		p, ok := m["forkbox_runsc_standby_pending"]
		if !ok {
			t.Fatal("no forkbox_runsc_standby_pending in the daemon's metrics")
		}
		if p == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("forkbox_runsc_standby_pending %v after a minute, want 0", p)
		}
	}
}
