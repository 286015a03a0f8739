package daemon

import (
	"context"
	"testing"

	"github.com/forkbox/forkbox/internal/store"
)

// A pause is not cut short by a caller that went away, and a runtime call
// that failed after it took effect counts as done; one that failed before
// it did is an error and changes nothing.
func TestSuspendSettles(t *testing.T) {
	h := newHarness(t)
	id := h.create(CreateOptions{Name: "s", Runtime: RuntimeGVisor})
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := h.d.Pause(gone, id); err == nil {
		// The lock or the store may refuse a cancelled caller first; what
		// matters is that no half-done pause is left.
		if !h.suspended(id) || h.state(id).State != store.StatePaused {
			t.Fatalf("pause with a cancelled caller: suspended %v, state %s", h.suspended(id), h.state(id).State)
		}
		if _, err := h.d.Unpause(context.Background(), id); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	sb := h.state(id)
	h.w.moveErr, h.w.moveTakes = errInjected, true
	if err := h.d.suspend(ctx, sb); err != nil {
		t.Fatalf("a pause that took effect, then failed: %v", err)
	}
	if !h.suspended(id) {
		t.Fatal("not paused after a pause that took effect")
	}
	h.w.moveErr, h.w.moveTakes = errInjected, true
	if err := h.d.unsuspend(ctx, sb); err != nil {
		t.Fatalf("a resume that took effect, then failed: %v", err)
	}
	h.w.moveErr, h.w.moveTakes = errInjected, false
	if err := h.d.suspend(ctx, sb); err == nil {
		t.Fatal("a pause that failed before it took effect: got nil error")
	}
	if h.suspended(id) {
		t.Fatal("paused after a pause that failed")
	}
	// A capture's stop that fails leaves the source running and recorded so.
	h.w.moveErr, h.w.moveTakes = errInjected, false
	if _, err := h.d.Checkpoint(ctx, id, "t"); err == nil {
		t.Fatal("checkpoint whose stop failed: got nil error")
	}
	if h.suspended(id) || h.state(id).State != store.StateRunning {
		t.Fatalf("after a failed capture stop: suspended %v, state %s; want running", h.suspended(id), h.state(id).State)
	}
}

// A sandbox cut in a capture's stop whose first resume at reconcile fails
// is degraded; the next recheck resumes it, since no caller paused it. One
// its user paused stays paused through the same path.
func TestDegradedSuspendedFollowsTheLedger(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	cut := h.create(CreateOptions{Name: "cut", Runtime: RuntimeGVisor})
	user := h.create(CreateOptions{Name: "user", Runtime: RuntimeGVisor})
	if _, err := h.d.Pause(ctx, user); err != nil {
		t.Fatal(err)
	}
	must(t, h.w.move(cut, "running", "paused")) // the daemon died before its resume
	h.d.Close()
	h.d = nil
	h.w.moveErr, h.w.moveTakes = errInjected, false // reconcile's resume fails once
	h.reopen(h.runtimes(RuntimeGVisor, RuntimeCrun))
	if got := h.state(cut).State; got != store.StateDegraded {
		t.Fatalf("cut mid-capture, resume failed: %s, want degraded", got)
	}
	// The user's paused sandbox goes degraded too, so both take the path.
	must(t, h.d.setState(ctx, h.state(user), store.StateDegraded, "test"))
	if err := h.d.recheckDegraded(ctx); err != nil {
		t.Fatal(err)
	}
	if sb := h.state(cut); sb.State != store.StateRunning || h.suspended(cut) {
		t.Errorf("cut mid-capture after the recheck: %s, suspended %v; want running", sb.State, h.suspended(cut))
	}
	if sb := h.state(user); sb.State != store.StatePaused || !h.suspended(user) {
		t.Errorf("user-paused after the recheck: %s, suspended %v; want paused", sb.State, h.suspended(user))
	}
}
