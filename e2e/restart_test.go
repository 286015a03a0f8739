package e2e

import (
	"time"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/hostproc"

	"context"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// runscPids returns the host pids of a sandbox's runsc processes.
func runscPids(id string) []int {
	out, _ := exec.Command("pgrep", "-f", "runsc.* "+id+"$").Output()
	var pids []int
	for _, f := range strings.Fields(string(out)) {
		if p, err := strconv.Atoi(f); err == nil {
			pids = append(pids, p)
		}
	}
	return pids
}

func TestDaemonRestart(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		t.Run(sig.String(), func(t *testing.T) {
			ctx := context.Background()
			keep := newSandbox(t, clientOpts())
			mustSh(t, keep, "echo before > /root/state")
			lost, err := env.c.CreateSandbox(ctx, clientOpts())
			if err != nil {
				t.Fatal(err)
			}
			before, _ := keep.Events(ctx)

			if err := stopDaemon(sig); err != nil {
				t.Fatalf("daemon exit: %v", err)
			}
			// While the daemon is down, one sandbox dies (its runtime
			// processes are killed): the restarted daemon must clean it.
			pids := runscPids(lost.ID)
			if len(pids) == 0 {
				t.Fatalf("no runsc process found for %s", lost.ID)
			}
			for _, p := range pids {
				syscall.Kill(p, syscall.SIGKILL)
			}
			if err := startDaemon(); err != nil {
				t.Fatal(err)
			}

			// The live sandbox is found, with its files and its ledger.
			if out := mustSh(t, keep, "cat /root/state"); out != "before\n" {
				t.Errorf("after restart: %q", out)
			}
			after, err := keep.Events(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(after) < len(before) {
				t.Fatalf("ledger shrank from %d to %d events", len(before), len(after))
			}
			for i := range before {
				if after[i].Seq != before[i].Seq || after[i].Type != before[i].Type {
					t.Errorf("ledger event %d changed: %+v -> %+v", i, before[i], after[i])
				}
			}
			if !hasEvent(after, "sandbox.recovered") {
				t.Errorf("ledger has no sandbox.recovered after restart: %v", types(after))
			}

			// The dead one is closed and nothing of it is left.
			if err := lost.Refresh(ctx); err != nil || lost.Info.State != "closed" {
				t.Errorf("dead sandbox: state %q, %v; want closed", lost.Info.GetState(), err)
			}
			evs, _ := lost.Events(ctx)
			if !hasEvent(evs, "sandbox.lost") || !hasEvent(evs, "sandbox.closed") {
				t.Errorf("dead sandbox's ledger: %v; want sandbox.lost and sandbox.closed", types(evs))
			}
			checkNoLeftovers(t, lost.ID)
		})
	}
}

// TestDaemonKilledMidCreate kills the daemon while creates are in flight;
// after a restart every sandbox is either running and usable or closed with
// nothing left.
func TestDaemonKilledMidCreate(t *testing.T) {
	ctx := context.Background()
	errs := make(chan error, 4)
	for i := 0; i < 4; i++ {
		go func() {
			_, err := env.c.CreateSandbox(ctx, clientOpts())
			errs <- err
		}()
	}
	// Kill as soon as the first sandbox record exists.
	for i := 0; i < 400; i++ {
		list, _ := env.c.ListSandboxes(ctx, false)
		if len(list) > 0 {
			break
		}
	}
	if err := stopDaemon(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 4; i++ {
		<-errs
	}
	if err := startDaemon(); err != nil {
		t.Fatal(err)
	}
	all, err := env.c.ListSandboxes(ctx, true)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range all {
		t.Logf("after restart: %s %s (%s)", s.Id, s.State, s.Error)
		switch s.State {
		case "running":
			sb, err := env.c.Sandbox(ctx, s.Id)
			if err != nil {
				t.Fatal(err)
			}
			mustSh(t, sb, "true")
			if err := sb.Close(ctx); err != nil {
				t.Errorf("close %s: %v", s.Id, err)
			}
			checkNoLeftovers(t, s.Id)
		case "closed":
			checkNoLeftovers(t, s.Id)
		default:
			t.Errorf("after restart sandbox %s is %s; want running or closed", s.Id, s.State)
		}
	}
}

func hasEvent(evs []clientEvent, typ string) bool {
	for _, e := range evs {
		if e.Type == typ {
			return true
		}
	}
	return false
}

func types(evs []clientEvent) []string {
	var out []string
	for _, e := range evs {
		out = append(out, e.Type)
	}
	return out
}

type clientEvent = client.Event

// TestDeadSandboxFailsExec: a sandbox whose runtime is killed under a
// running daemon is found dead by its next exec: the exec fails at once
// with FailedPrecondition saying so, the sandbox is recorded failed (so
// resume takes it), and closing it leaves nothing. Before, it stayed
// running, every exec timing out on its agent, until a restart or a close.
func TestDeadSandboxFailsExec(t *testing.T) {
	ctx := context.Background()
	sb, err := env.c.CreateSandbox(ctx, gvisorOpts())
	if err != nil {
		t.Fatal(err)
	}
	mustSh(t, sb, "true")
	killRuntime(t, sb.ID)
	_, err = sb.Exec(ctx, client.ExecOptions{Shell: "true"})
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "died") {
		t.Fatalf("exec in a dead sandbox: %v, want FailedPrecondition saying it died", err)
	}
	if err := sb.Refresh(ctx); err != nil || sb.Info.State != "failed" {
		t.Errorf("after: state %q (%v), want failed", sb.Info.State, err)
	}
	if err := sb.Close(ctx); err != nil {
		t.Fatal(err)
	}
	checkNoLeftovers(t, sb.ID)
}

// TestDeadPausedSandboxAfterRestart: a paused sandbox whose processes are
// killed while the daemon is down is found lost by the restart's
// reconcile, and leaves nothing. Before, runsc still said paused (its state
// file, with the dead pid), reconcile kept it paused, and it could be
// neither unpaused nor used until closed.
func TestDeadPausedSandboxAfterRestart(t *testing.T) {
	ctx := context.Background()
	sb, err := env.c.CreateSandbox(ctx, gvisorOpts())
	if err != nil {
		t.Fatal(err)
	}
	if err := sb.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	if err := stopDaemon(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killRuntime(t, sb.ID)
	if err := startDaemon(); err != nil {
		t.Fatal(err)
	}
	if err := sb.Refresh(ctx); err != nil || sb.Info.State != "closed" {
		t.Errorf("after the restart: state %q (%v), want closed (lost)", sb.Info.State, err)
	}
	checkNoLeftovers(t, sb.ID)
}

// killRuntime SIGKILLs every runsc process of sandbox id and waits until
// each has exited (gone, or a zombie nobody reaped yet).
func killRuntime(t *testing.T, id string) {
	t.Helper()
	pids := runscPids(id)
	if len(pids) == 0 {
		t.Fatalf("no runsc process of %s to kill", id)
	}
	for _, p := range pids {
		syscall.Kill(p, syscall.SIGKILL)
	}
	for _, p := range pids {
		if !hostproc.WaitExited(context.Background(), p, 30*time.Second) {
			t.Fatalf("runsc process %d of %s still runs 30 s after SIGKILL", p, id)
		}
	}
}
