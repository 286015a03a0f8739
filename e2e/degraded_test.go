package e2e

import (
	"context"
	"os/exec"
	"strings"
	"syscall"
	"testing"
)

// A daemon restarted without the runsc binary keeps its gVisor sandboxes:
// they are degraded (visible, with the reason), their processes and files
// untouched; a restart with the binary back finds them running.
func TestRestartWithoutRuntimeKeepsSandboxes(t *testing.T) {
	ctx := context.Background()
	sb := newSandbox(t, clientOpts())
	mustSh(t, sb, "echo kept > /root/state")

	withDaemonFlags(t, "--runsc", "/nonexistent/runsc", "--runtime", "crun")
	if err := sb.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if sb.Info.State != "degraded" || !strings.Contains(sb.Info.Error, "runtime gvisor") {
		t.Errorf("without runsc: state %q, error %q; want degraded, naming the runtime", sb.Info.State, sb.Info.Error)
	}
	if len(runscPids(sb.ID)) == 0 {
		t.Error("without runsc: the sandbox's runsc processes were killed")
	}
	list, err := env.c.ListSandboxes(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, s := range list {
		found = found || (s.Id == sb.ID && s.State == "degraded")
	}
	if !found {
		t.Errorf("list does not show %s as degraded", sb.ID)
	}
	evs, _ := sb.Events(ctx)
	if !hasEvent(evs, "sandbox.degraded") {
		t.Errorf("ledger %v: want sandbox.degraded", types(evs))
	}

	// The usual flags again: reconcile finds it healthy.
	env.extra = nil
	restartDaemon(t, syscall.SIGTERM)
	if err := sb.Refresh(ctx); err != nil || sb.Info.State != "running" {
		t.Fatalf("runsc back: state %q, %v; want running", sb.Info.GetState(), err)
	}
	if out := mustSh(t, sb, "cat /root/state"); out != "kept\n" {
		t.Errorf("runsc back: /root/state = %q, want kept", out)
	}
}

// A daemon killed while a gVisor sandbox is stopped for a capture (runsc
// pause, before the resume) leaves it paused inside its sentry while the
// ledger says running: its agent cannot answer. The restarted daemon takes
// runsc's word for it and resumes it, rather than keeping it degraded. The
// state is made exactly: stopDaemon first, then the pause the kill cut
// short, behind the daemon's back.
func TestRestartResumesSandboxCutMidCapture(t *testing.T) {
	ctx := context.Background()
	sb := newSandbox(t, clientOpts())
	mustSh(t, sb, "echo kept > /root/state")
	if err := stopDaemon(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("runsc", "--root", runscRoot(sb.ID), "pause", sb.ID).CombinedOutput(); err != nil {
		t.Fatalf("runsc pause: %v: %s", err, out)
	}
	if err := startDaemon(); err != nil {
		t.Fatal(err)
	}
	if err := sb.Refresh(ctx); err != nil || sb.Info.State != "running" {
		t.Fatalf("after the restart: state %q (%q), %v; want running", sb.Info.GetState(), sb.Info.GetError(), err)
	}
	if out := mustSh(t, sb, "cat /root/state"); out != "kept\n" {
		t.Errorf("after the restart: /root/state = %q, want kept", out)
	}
	if stoppedInPlace(t, sb.ID) {
		t.Error("after the restart: runsc still reports the sandbox paused")
	}
}
