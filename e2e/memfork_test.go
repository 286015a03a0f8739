package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/errdefs"
)

// TestMemoryFork: a process holding state only in memory continues in each
// child from the source's value; children diverge; a server listening in
// the source answers in each child; the source keeps running.
func TestMemoryFork(t *testing.T) {
	ctx := context.Background()
	o := clientOpts()
	o.Name = "memsrc"
	src := newSandbox(t, o)
	mustSh(t, src, "mkdir -p /www && echo served-by-memsrc > /www/index.html")
	if _, err := src.Start(ctx, client.ExecOptions{Shell: counterLoop}); err != nil {
		t.Fatal(err)
	}
	if _, err := src.Start(ctx, client.ExecOptions{Shell: "httpd -f -p 8080 -h /www"}); err != nil {
		t.Fatal(err)
	}
	// Both processes are up before the fork: the counter has ticked and the
	// server answers (waited for as conditions, not slept for).
	tok, beforeFork := waitCounter(t, src, "the counter loop has started", func(n int) bool { return n >= 1 })
	waitHTTP(t, fmt.Sprintf("http://%s:8080/index.html", src.Info.Ip))

	res, err := src.Fork(ctx, client.ForkOptions{Tag: "live", Count: 2, Memory: true})
	if err != nil {
		t.Fatal(err)
	}
	kids := res.Sandboxes()
	closeAll(t, kids)
	if res.Captured != "filesystem+memory" || res.Checkpoint.Kind != "filesystem+memory" || len(kids) != 2 {
		t.Fatalf("memory fork: captured %q, %d children: %+v", res.Captured, len(kids), res.Children)
	}
	for i, k := range kids {
		ktok, n := readCounter(t, k)
		if ktok != tok {
			t.Errorf("child %d: token %s, want the source's %s (memory not carried)", i, ktok, tok)
		}
		// The child continues from the source's counter, which had reached
		// beforeFork before the fork; how far it has run since depends on
		// the machine's load, so no upper bound is asserted.
		if n < beforeFork {
			t.Errorf("child %d: counter %d; the source was already at %d before the fork", i, n, beforeFork)
		}
		if host := strings.TrimSpace(mustSh(t, k, "hostname")); host != k.Info.Name {
			t.Errorf("child %d: hostname %q, want %q", i, host, k.Info.Name)
		}
		checkCgroupLimits(t, k.ID, 100000, 1024) // its own limits, as the source's
		// Its restore ran with a raised quota; inside, the sandbox's own
		// cgroupfs shows what its image holds, the limit.
		if q := strings.TrimSpace(mustSh(t, k, "cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us")); q != "100000" {
			t.Errorf("child %d: its cgroupfs shows a CPU quota of %s, want the limit 100000", i, q)
		}
		// The listening socket listens in each child, at the child's address.
		resp, err := http.Get(fmt.Sprintf("http://%s:8080/index.html", k.Info.Ip))
		if err != nil {
			t.Errorf("child %d: server from the source does not answer: %v", i, err)
			continue
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(body) != "served-by-memsrc\n" {
			t.Errorf("child %d: server answered %q", i, body)
		}
	}
	// Children diverge: each one's own writes, and its counter runs on.
	for i, k := range kids {
		mustSh(t, k, fmt.Sprintf("echo child-%d > /www/who", i))
	}
	for i, k := range kids {
		if out := mustSh(t, k, "cat /www/who"); out != fmt.Sprintf("child-%d\n", i) {
			t.Errorf("child %d sees %q", i, out)
		}
	}
	if _, _, r := sh(t, src, "cat /www/who"); r.ExitCode == 0 {
		t.Errorf("a child's write reached the source")
	}
	// The source keeps running with its own state.
	stok, n1 := readCounter(t, src)
	if stok != tok {
		t.Errorf("the source after the fork: token %s, was %s", stok, tok)
	}
	waitCounter(t, src, fmt.Sprintf("the source's counter runs on after the fork (past %d)", n1), func(n int) bool { return n > n1 })
	// Each child has its own agent token now: the ledger says it was told.
	for i, k := range kids {
		evs, _ := k.Events(ctx)
		if !hasEvent(evs, "sandbox.fork_notified") {
			t.Errorf("child %d: no sandbox.fork_notified in %v", i, types(evs))
		}
	}
}

// waitHTTP polls url until it answers, bounded by a generous deadline.
func waitHTTP(t *testing.T, url string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s does not answer in 3 minutes: %v", url, err)
		case <-time.After(20 * time.Millisecond): // poll interval
		}
	}
}

func TestMemoryForkOfPausedAndRestore(t *testing.T) {
	ctx := context.Background()
	src := newSandbox(t, clientOpts())
	if _, err := src.Start(ctx, client.ExecOptions{Shell: counterLoop}); err != nil {
		t.Fatal(err)
	}
	// The loop has written its token (its memory-only state) before the
	// pause: waited for, not slept for.
	tok, _ := waitCounter(t, src, "the counter loop has started", func(n int) bool { return n >= 1 })
	if err := src.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	res, err := src.Fork(ctx, client.ForkOptions{Memory: true})
	if err != nil || res.Children[0].Err != nil {
		t.Fatalf("memory fork of a paused sandbox: %v %+v", err, res)
	}
	closeAll(t, res.Sandboxes())
	if ktok, _ := readCounter(t, res.Children[0].Sandbox); ktok != tok {
		t.Errorf("child of a paused source: token %s, want %s", ktok, tok)
	}
	if err := src.Refresh(ctx); err != nil || src.Info.State != "paused" {
		t.Errorf("source after a memory fork while paused: %q %v", src.Info.GetState(), err)
	}
	// RestoreSnapshot of a memory checkpoint resumes the processes too.
	r, err := env.c.RestoreSnapshot(ctx, res.Checkpoint.Id, client.Overrides{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	closeAll(t, []*client.Sandbox{r})
	if rtok, _ := readCounter(t, r); rtok != tok {
		t.Errorf("restore of a memory checkpoint: token %s, want %s", rtok, tok)
	}
	src.Unpause(ctx)
}

func TestMemoryForkNeedsGVisor(t *testing.T) {
	curRuntime = "crun"
	defer func() { curRuntime = "gvisor" }()
	sb := newSandbox(t, clientOpts())
	before := countSandboxes(t)
	_, err := sb.Fork(context.Background(), client.ForkOptions{Memory: true})
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "CRIU") {
		t.Errorf("memory fork under crun: got %v, want FailedPrecondition with the reason", err)
	}
	if n := countSandboxes(t); n != before {
		t.Errorf("a refused memory fork made sandboxes")
	}
}
