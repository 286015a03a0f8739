package daemon

import (
	"context"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/forkbox/forkbox/internal/runtime"
	"github.com/forkbox/forkbox/internal/store"
)

func (h *harness) state(id string) *store.Sandbox {
	h.t.Helper()
	sb, err := h.d.Get(context.Background(), id)
	if err != nil {
		h.t.Fatal(err)
	}
	return sb
}

// After a restart, reconcile keeps what it cannot confirm (an agent that
// does not answer, a runtime binary that is missing) as degraded, with the
// reason, and never tears it down; it cleans what is really gone; a later
// reconcile brings a degraded sandbox back; a close removes it.
func TestReconcileDegraded(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	slow := h.create(CreateOptions{Name: "slow"})
	gone := h.create(CreateOptions{Name: "gone"})
	dying := h.create(CreateOptions{Name: "dying"})
	paused := h.create(CreateOptions{Name: "paused"})
	if _, err := h.d.Pause(ctx, paused); err != nil {
		t.Fatal(err)
	}
	slowUpper := h.upper(slow)

	h.w.silence(slow)
	h.w.crash(gone)
	h.w.kill(dying)
	h.reopen(h.runtimes(RuntimeGVisor, RuntimeCrun))

	sb := h.state(slow)
	if sb.State != store.StateDegraded || !strings.Contains(sb.Error, "agent did not answer") {
		t.Errorf("silent agent: state %s %q; want degraded, naming the agent", sb.State, sb.Error)
	}
	if h.w.status(slow) != "running" {
		t.Errorf("silent agent: container %q, want left running", h.w.status(slow))
	}
	if _, err := os.Stat(slowUpper); err != nil {
		t.Errorf("silent agent: writable layer removed: %v", err)
	}
	if evs := h.events(slow); !slices.Contains(evs, store.EventSandboxDegraded) {
		t.Errorf("silent agent ledger %v: want %s", evs, store.EventSandboxDegraded)
	}
	for _, id := range []string{gone, dying} {
		if sb := h.state(id); sb.State != store.StateClosed {
			t.Errorf("%s: state %s, want closed", id, sb.State)
		}
	}
	if evs := h.events(gone); !slices.Contains(evs, store.EventSandboxLost) || !slices.Contains(evs, store.EventSandboxClosed) {
		t.Errorf("dead container ledger %v: want lost and closed", evs)
	}
	if sb := h.state(paused); sb.State != store.StatePaused {
		t.Errorf("paused: state %s, want paused", sb.State)
	}

	// The agent answers again: the running daemon's next look finds it.
	if err := h.w.revive(slow); err != nil {
		t.Fatal(err)
	}
	if err := h.d.recheckDegraded(ctx); err != nil {
		t.Fatal(err)
	}
	if sb := h.state(slow); sb.State != store.StateRunning || sb.Error != "" {
		t.Errorf("revived: state %s %q, want running, no error", sb.State, sb.Error)
	}
	if evs := h.events(slow); !slices.Contains(evs, store.EventSandboxFound) {
		t.Errorf("revived ledger %v: want %s", evs, store.EventSandboxFound)
	}

	// The gvisor binary is missing: kept, degraded, running and paused alike.
	h.cfg.DefaultRuntime = RuntimeCrun
	h.reopen(h.runtimes(RuntimeCrun))
	for _, id := range []string{slow, paused} {
		sb := h.state(id)
		if sb.State != store.StateDegraded || !strings.Contains(sb.Error, "runtime gvisor is not available") {
			t.Errorf("%s without its runtime: state %s %q; want degraded, naming the runtime", id, sb.State, sb.Error)
		}
		if st := h.w.status(id); st != runtime.StatusRunning && st != runtime.StatusPaused {
			t.Errorf("%s without its runtime: container %q, want left running (or paused)", id, st)
		}
	}
	// A degraded sandbox refuses work that needs it healthy.
	if _, err := h.d.Checkpoint(ctx, slow, ""); err == nil {
		t.Error("checkpoint of a degraded sandbox: got nil, want an error")
	}

	// The binary is back: both return to what the host says they are.
	h.reopen(h.runtimes(RuntimeGVisor, RuntimeCrun))
	if sb := h.state(slow); sb.State != store.StateRunning {
		t.Errorf("runtime back: slow is %s, want running", sb.State)
	}
	if sb := h.state(paused); sb.State != store.StatePaused {
		t.Errorf("runtime back: paused is %s, want paused (it is frozen)", sb.State)
	}

	// An explicit close deals with a degraded sandbox.
	h.reopen(h.runtimes(RuntimeCrun))
	if err := h.d.Delete(ctx, slow); err != nil {
		t.Fatal(err)
	}
	if sb := h.state(slow); sb.State != store.StateClosed {
		t.Errorf("closed degraded sandbox: %s, want closed", sb.State)
	}
	if _, err := os.Stat(slowUpper); !os.IsNotExist(err) {
		t.Errorf("closed degraded sandbox: writable layer left (%v)", err)
	}
}

// A sandbox recorded paused that a crash left running is paused again; one
// recorded running but left paused runs again. The truth is the runtime's
// for gVisor and the freezer's for crun; a gVisor sandbox whose host cgroup
// an older daemon froze is thawed.
func TestReconcileFreezerIsTheTruth(t *testing.T) {
	for _, rt := range []string{RuntimeGVisor, RuntimeCrun} {
		t.Run(rt, func(t *testing.T) {
			h := newHarness(t)
			ctx := context.Background()
			p := h.create(CreateOptions{Name: "p", Runtime: rt})
			r := h.create(CreateOptions{Name: "r", Runtime: rt})
			if _, err := h.d.Pause(ctx, p); err != nil {
				t.Fatal(err)
			}
			// Behind the daemon's back, as a crash between recording and
			// acting leaves them.
			if rt == RuntimeGVisor {
				must(t, h.w.move(p, runtime.StatusPaused, runtime.StatusRunning))
				must(t, h.w.move(r, runtime.StatusRunning, runtime.StatusPaused))
			} else {
				must(t, h.w.Thaw(ctx, h.d.cgroupPath(p)))
				must(t, h.w.Freeze(ctx, h.d.cgroupPath(r)))
			}
			h.reopen(h.runtimes(RuntimeGVisor, RuntimeCrun))
			if s := h.suspended(p); !s || h.state(p).State != store.StatePaused {
				t.Errorf("recorded paused: suspended %v state %s; want suspended, paused", s, h.state(p).State)
			}
			if s := h.suspended(r); s || h.state(r).State != store.StateRunning {
				t.Errorf("recorded running: suspended %v state %s; want running, running", s, h.state(r).State)
			}
		})
	}
	t.Run("gvisor frozen by an older daemon", func(t *testing.T) {
		h := newHarness(t)
		ctx := context.Background()
		r := h.create(CreateOptions{Name: "r", Runtime: RuntimeGVisor})
		must(t, h.w.Freeze(ctx, h.d.cgroupPath(r)))
		h.reopen(h.runtimes(RuntimeGVisor, RuntimeCrun))
		if f, _ := h.w.Frozen(h.d.cgroupPath(r)); f || h.state(r).State != store.StateRunning {
			t.Errorf("frozen host cgroup: frozen %v state %s; want thawed, running", f, h.state(r).State)
		}
	})
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// A crash between a hibernation's image and the port's release leaves a
// hibernated sandbox attached to the bridge: reconcile gives its port
// back, and it wakes as before.
func TestReconcileDetachesHibernated(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	id := h.create(CreateOptions{Name: "h"})
	if _, err := h.d.Hibernate(ctx, id); err != nil {
		t.Fatal(err)
	}
	h.w.mu.Lock()
	delete(h.w.detached, id) // the port not given back yet
	h.w.mu.Unlock()
	h.reopen(h.runtimes(RuntimeGVisor, RuntimeCrun))
	if sb := h.state(id); sb.State != store.StateHibernated || !h.w.isDetached(id) {
		t.Fatalf("after reconcile: state %s, detached %v; want hibernated, detached", sb.State, h.w.isDetached(id))
	}
	if sb, err := h.d.Wake(ctx, id); err != nil || sb.State != store.StateRunning || h.w.isDetached(id) {
		t.Fatalf("wake after reconcile: %v, %v, detached %v", sb, err, h.w.isDetached(id))
	}
}
