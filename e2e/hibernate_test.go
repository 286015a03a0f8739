package e2e

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/errdefs"
)

// counterLoop keeps a counter and a random token in a shell's memory only,
// and reports them to a file each tick; the file is output, not state.
const counterLoop = `tok=$(head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \n'); i=0
while :; do i=$((i+1)); echo "$tok $i" > /tmp/counter.tmp; mv /tmp/counter.tmp /tmp/counter; sleep 0.05; done`

func readCounter(t *testing.T, sb *client.Sandbox) (string, int) {
	t.Helper()
	f := strings.Fields(mustSh(t, sb, "cat /tmp/counter"))
	if len(f) != 2 {
		t.Fatalf("counter file: %q", f)
	}
	n, _ := strconv.Atoi(f[1])
	return f[0], n
}

func TestHibernateWakeCycles(t *testing.T) {
	ctx := context.Background()
	sb := newSandbox(t, clientOpts())
	if _, err := sb.Start(ctx, client.ExecOptions{Shell: counterLoop}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	tok, last := readCounter(t, sb)
	for cycle := 1; cycle <= 20; cycle++ {
		mustSh(t, sb, fmt.Sprintf("mkdir -p /root/cycles && echo content-%d > /root/cycles/%d", cycle, cycle))
		_, before := readCounter(t, sb)
		if err := sb.Hibernate(ctx); err != nil {
			t.Fatalf("cycle %d: hibernate: %v", cycle, err)
		}
		if sb.Info.State != "hibernated" {
			t.Fatalf("cycle %d: state %q after hibernate", cycle, sb.Info.State)
		}
		if len(runscPids(sb.ID)) != 0 {
			t.Fatalf("cycle %d: a hibernated sandbox still has runtime processes: %v", cycle, runscPids(sb.ID))
		}
		// The next exec wakes it; every file of every cycle is there.
		out := mustSh(t, sb, "cat /root/cycles/*")
		var want strings.Builder
		for i := 1; i <= cycle; i++ {
			want.WriteString(fmt.Sprintf("content-%d\n", i))
		}
		if cycle >= 10 { // cat sorts 1, 10, 11, ..., 2, 20, 3: compare as sets
			if len(strings.Fields(out)) != cycle {
				t.Fatalf("cycle %d: %d files, want %d: %q", cycle, len(strings.Fields(out)), cycle, out)
			}
		} else if out != want.String() {
			t.Fatalf("cycle %d: files %q, want %q", cycle, out, want.String())
		}
		// The process kept its memory: same token, counter continues.
		gotTok, n := readCounter(t, sb)
		if gotTok != tok || n < before {
			t.Fatalf("cycle %d: counter %s %d after wake, was %s %d: memory lost", cycle, gotTok, n, tok, before)
		}
		last = n
	}
	time.Sleep(200 * time.Millisecond)
	if _, n := readCounter(t, sb); n <= last {
		t.Errorf("the counter stopped after the last wake: %d", n)
	}
	evs, _ := sb.Events(ctx)
	hib, woke := 0, 0
	for _, e := range evs {
		switch e.Type {
		case "sandbox.hibernated":
			hib++
		case "sandbox.woken":
			woke++
		}
	}
	if hib != 20 || woke != 20 {
		t.Errorf("ledger: %d hibernated, %d woken; want 20 each", hib, woke)
	}
	if err := sb.Hibernate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := sb.Close(ctx); err != nil {
		t.Fatal(err)
	}
	checkNoLeftovers(t, sb.ID)
}

func TestHibernateNeedsGVisor(t *testing.T) {
	curRuntime = "crun"
	defer func() { curRuntime = "gvisor" }()
	sb := newSandbox(t, clientOpts())
	if err := sb.Hibernate(context.Background()); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "CRIU") {
		t.Errorf("hibernate under crun: got %v, want FailedPrecondition saying why", err)
	}
	mustSh(t, sb, "true")
}

func TestIdleHibernation(t *testing.T) {
	ctx := context.Background()
	withDaemonFlags(t, "--idle-hibernate", "1s")
	sb := newSandbox(t, clientOpts())
	mustSh(t, sb, "echo before-idle > /root/f")
	// A long exec keeps it awake while it runs.
	if _, _, r := sh(t, sb, "sleep 2; echo done"); r.ExitCode != 0 {
		t.Fatalf("long exec: %+v", r)
	}
	if err := sb.Refresh(ctx); err != nil || sb.Info.State != "running" {
		t.Fatalf("hibernated while busy: %q %v", sb.Info.GetState(), err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		if err := sb.Refresh(ctx); err == nil && sb.Info.State == "hibernated" {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if sb.Info.State != "hibernated" {
		t.Fatalf("idle sandbox not hibernated: %s", sb.Info.State)
	}
	if out := mustSh(t, sb, "cat /root/f"); out != "before-idle\n" {
		t.Errorf("after waking from idle hibernation: %q", out)
	}
}
