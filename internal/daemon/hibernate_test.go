package daemon

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/agent"
	"github.com/forkbox/forkbox/internal/runtime"
	"github.com/forkbox/forkbox/internal/store"
)

func TestPauseUnpause(t *testing.T) {
	for _, rt := range []string{RuntimeGVisor, RuntimeCrun} {
		t.Run(rt, func(t *testing.T) {
			h := newHarness(t)
			ctx := context.Background()
			id := h.create(CreateOptions{Name: "p", Runtime: rt})
			if sb, err := h.d.Pause(ctx, id); err != nil || sb.State != store.StatePaused {
				t.Fatalf("pause: %v, %v", sb, err)
			}
			if !h.suspended(id) {
				t.Error("paused but not suspended")
			}
			if _, err := h.d.Pause(ctx, id); !errdefs.IsFailedPrecondition(err) {
				t.Errorf("pause twice: got %v, want FailedPrecondition", err)
			}
			if sb, err := h.d.Unpause(ctx, id); err != nil || sb.State != store.StateRunning {
				t.Fatalf("unpause: %v, %v", sb, err)
			}
			if h.suspended(id) {
				t.Error("unpaused but suspended")
			}
		})
	}
}

// suspended reports whether a sandbox's processes are stopped in place the
// way its runtime stops them: gVisor inside its sentry (the runtime says
// paused, the host cgroup is never frozen), crun by the freezer.
func (h *harness) suspended(id string) bool {
	h.t.Helper()
	frozen, _ := h.w.Frozen(h.d.cgroupPath(id))
	if h.state(id).Runtime == RuntimeGVisor {
		if frozen {
			h.t.Errorf("%s: a gVisor sandbox's host cgroup is frozen", id)
		}
		return h.w.status(id) == runtime.StatusPaused
	}
	return frozen
}

// setState refuses a move the table does not allow, and a move from a state
// the sandbox is no longer in (another operation changed it meanwhile).
func TestSetState(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	id := h.create(CreateOptions{Name: "s"})
	sb := h.state(id)
	if err := h.d.setState(ctx, sb, store.StateCreating, ""); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("running -> creating: got %v, want FailedPrecondition", err)
	}
	stale := *sb
	if err := h.d.setState(ctx, sb, store.StatePaused, ""); err != nil {
		t.Fatal(err)
	}
	if err := h.d.setState(ctx, &stale, store.StateHibernating, ""); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("stale running -> hibernating: got %v, want FailedPrecondition", err)
	}
	if got := h.state(id).State; got != store.StatePaused {
		t.Errorf("after a stale change: %s, want paused", got)
	}
}

func TestHibernateWake(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	id := h.create(CreateOptions{Name: "h"})
	sb, err := h.d.Hibernate(ctx, id)
	if err != nil || sb.State != store.StateHibernated {
		t.Fatalf("hibernate: %v, %v", sb, err)
	}
	if h.w.status(id) != "" || !h.d.hibernationComplete(id) {
		t.Errorf("hibernated: container %q, image complete %v; want none, true", h.w.status(id), h.d.hibernationComplete(id))
	}
	if !h.w.isDetached(id) {
		t.Error("hibernated, but its bridge port is not given back")
	}
	if sb, err = h.d.Wake(ctx, id); err != nil || sb.State != store.StateRunning {
		t.Fatalf("wake: %v, %v", sb, err)
	}
	if h.w.isDetached(id) {
		t.Error("woken, but detached from the bridge")
	}
	if err := agent.WaitReady(ctx, h.d.agent(sb)); err != nil {
		t.Errorf("woken agent: %v", err)
	}
	if _, err := os.Stat(h.d.hibernateDir(id)); !os.IsNotExist(err) {
		t.Errorf("hibernation image left after wake (%v)", err)
	}
}

// A wake that cannot get a bridge port (the bridge is full: it has 1,023)
// or whose restore fails (after it started the container, too) leaves the
// sandbox hibernated, its image whole, no container, its port given back;
// the next wake works.
func TestWakeFailureStaysHibernated(t *testing.T) {
	for _, tc := range []struct {
		name   string
		inject func(*world)
		class  func(error) bool
	}{
		{"full bridge", func(w *world) {
			w.attachErr = fmt.Errorf("network: bridge fb0 is full: %w", errdefs.ErrResourceExhausted)
		}, errdefs.IsResourceExhausted},
		{"restore fails", func(w *world) { w.restoreErr = errInjected }, func(err error) bool { return errors.Is(err, errInjected) }},
		{"restore starts then fails", func(w *world) { w.restoreErr, w.restoreStarts = errInjected, true },
			func(err error) bool { return errors.Is(err, errInjected) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			ctx := context.Background()
			id := h.create(CreateOptions{Name: "h"})
			if _, err := h.d.Hibernate(ctx, id); err != nil {
				t.Fatal(err)
			}
			tc.inject(h.w)
			if _, err := h.d.Wake(ctx, id); !tc.class(err) {
				t.Fatalf("wake: got %v, want the injected failure's class", err)
			}
			if got := h.state(id).State; got != store.StateHibernated {
				t.Errorf("after a failed wake: %s, want hibernated", got)
			}
			if !h.d.hibernationComplete(id) || !h.w.isDetached(id) || h.w.status(id) != "" {
				t.Errorf("after a failed wake: image complete %v, detached %v, container %q; want true, true, none",
					h.d.hibernationComplete(id), h.w.isDetached(id), h.w.status(id))
			}
			h.w.attachErr, h.w.restoreErr, h.w.restoreStarts = nil, nil, false
			if sb, err := h.d.Wake(ctx, id); err != nil || sb.State != store.StateRunning {
				t.Fatalf("wake again: %v, %v", sb, err)
			}
			if h.w.isDetached(id) {
				t.Error("woken, but detached from the bridge")
			}
		})
	}
}

// A failed hibernation is undone: back to the state it came from (paused
// again if it was) when the container still runs, failed when the
// checkpoint stopped it; no partial image is left.
func TestHibernateFailureIsUndone(t *testing.T) {
	for _, tc := range []struct {
		name          string
		pause, stops  bool
		want          store.State
		wantSuspended bool
		wantContainer string
	}{
		{"running and still running", false, false, store.StateRunning, false, "running"},
		{"paused and still running", true, false, store.StatePaused, true, "paused"},
		{"checkpoint stopped it", false, true, store.StateFailed, false, "stopped"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			ctx := context.Background()
			id := h.create(CreateOptions{Name: "h"})
			if tc.pause {
				if _, err := h.d.Pause(ctx, id); err != nil {
					t.Fatal(err)
				}
			}
			h.w.checkpointErr, h.w.checkpointStops = errInjected, tc.stops
			if _, err := h.d.Hibernate(ctx, id); err == nil {
				t.Fatal("hibernate with a failing checkpoint: got nil error")
			}
			if got := h.state(id).State; got != tc.want {
				t.Errorf("state %s, want %s", got, tc.want)
			}
			if s := h.suspended(id); s != tc.wantSuspended {
				t.Errorf("suspended %v, want %v", s, tc.wantSuspended)
			}
			if got := h.w.status(id); got != tc.wantContainer {
				t.Errorf("container %q, want %q", got, tc.wantContainer)
			}
			if _, err := os.Stat(h.d.hibernateDir(id)); !os.IsNotExist(err) {
				t.Errorf("partial hibernation image left (%v)", err)
			}
		})
	}
}

// Idle hibernation records its event only for sandboxes it hibernated.
func TestIdleHibernationEvent(t *testing.T) {
	h := newHarness(t)
	h.d.cfg.IdleHibernate = time.Hour
	ctx := context.Background()
	id := h.create(CreateOptions{Name: "idle"})
	h.d.busy(id)() // active just now
	// The sweep's clock says idle, but under the lock it is not: skipped.
	h.d.hibernateIdle(ctx, time.Now().Add(2*time.Hour))
	if got := h.state(id).State; got != store.StateRunning {
		t.Fatalf("skipped sandbox: %s, want running", got)
	}
	if evs := h.events(id); slices.Contains(evs, store.EventIdleHibernated) {
		t.Fatalf("skipped sandbox has %s: %v", store.EventIdleHibernated, evs)
	}
	a := h.d.act()
	a.mu.Lock()
	a.last[id] = time.Now().Add(-2 * time.Hour)
	a.mu.Unlock()
	h.d.hibernateIdle(ctx, time.Now())
	if got := h.state(id).State; got != store.StateHibernated {
		t.Fatalf("idle sandbox: %s, want hibernated", got)
	}
	if evs := h.events(id); !slices.Contains(evs, store.EventIdleHibernated) {
		t.Fatalf("idle sandbox ledger %v: want %s", evs, store.EventIdleHibernated)
	}
}

// A memory fork restores the source in place and starts children that
// continue its processes; each child's agent takes its own token.
func TestMemoryFork(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	src := h.create(CreateOptions{Name: "src"})
	if _, err := h.d.Pause(ctx, src); err != nil {
		t.Fatal(err)
	}
	res, err := h.d.Fork(ctx, ForkOptions{Source: src, Count: 2, Memory: true})
	if err != nil {
		t.Fatal(err)
	}
	if res.Captured != KindMemory {
		t.Fatalf("captured %q, want %q", res.Captured, KindMemory)
	}
	if sb := h.state(src); sb.State != store.StatePaused || !h.suspended(src) {
		t.Errorf("source after a memory fork: %s, container %q; want paused, paused", sb.State, h.w.status(src))
	}
	for i, c := range res.Children {
		if c.Err != nil {
			t.Fatalf("child %d: %v", i, c.Err)
		}
		wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
		err := agent.WaitReady(wctx, h.d.agent(c.Sandbox))
		wcancel()
		if err != nil {
			t.Errorf("child %d agent with its own token: %v", i, err)
		}
		if evs := h.events(c.Sandbox.ID); !slices.Contains(evs, store.EventForkNotified) {
			t.Errorf("child %d ledger %v: want %s", i, evs, store.EventForkNotified)
		}
	}
	if err := agent.WaitReady(ctx, h.d.agent(h.state(src))); err != nil {
		t.Errorf("source agent after the checkpoint: %v", err)
	}
}

// A failed memory checkpoint: when the checkpoint itself fails and the
// source keeps running, the source is as it was and no image is left; when
// the source cannot be brought back afterwards, it is recorded failed and
// the checkpoint is kept to resume it from.
func TestMemoryCheckpointFailure(t *testing.T) {
	for _, tc := range []struct {
		name   string
		inject func(w *world)
		want   store.State
		kept   bool
	}{
		{"checkpoint fails", func(w *world) { w.checkpointErr = errInjected }, store.StateRunning, false},
		{"source restore fails", func(w *world) { w.restoreErr = errInjected }, store.StateFailed, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			ctx := context.Background()
			src := h.create(CreateOptions{Name: "src"})
			tc.inject(h.w)
			if _, err := h.d.CheckpointWith(ctx, src, "m", true); err == nil {
				t.Fatal("got nil error")
			}
			if sb := h.state(src); sb.State != tc.want {
				t.Errorf("source: %s, want %s", sb.State, tc.want)
			}
			cks, err := h.d.ListCheckpoints(ctx, src)
			if err != nil {
				t.Fatal(err)
			}
			images, _ := os.ReadDir(h.d.memImageDir(""))
			if !tc.kept {
				if len(cks) != 0 || len(images) != 0 {
					t.Errorf("left: checkpoints %v, memory images %v; want none", cks, images)
				}
				return
			}
			if len(cks) != 1 || cks[0].Kind != KindMemory || len(images) != 1 {
				t.Fatalf("checkpoints %v, memory images %v; want the memory checkpoint kept", cks, images)
			}
			h.w.restoreErr = nil
			sb, ck, _, err := h.d.Resume(ctx, src)
			if err != nil {
				t.Fatalf("resume: %v", err)
			}
			if sb.State != store.StateRunning || ck.ID != cks[0].ID || sb.Name != "src" {
				t.Errorf("resumed: %s from %s named %q; want running from %s named src", sb.State, ck.ID, sb.Name, cks[0].ID)
			}
		})
	}
}

// A hibernation cut by a crash before its image is whole leaves the
// container running (gVisor checkpoints a running sandbox, so a paused one
// was resumed first): reconcile brings it back as it was, paused again if
// a caller had paused it (and not since woken: a wake leaves it running).
func TestReconcileCutHibernation(t *testing.T) {
	for _, tc := range []struct {
		name        string
		pause, wake bool
	}{{"running", false, false}, {"paused", true, false}, {"paused then woken", true, true}} {
		pause := tc.pause && !tc.wake
		want := map[bool]store.State{false: store.StateRunning, true: store.StatePaused}[pause]
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			ctx := context.Background()
			id := h.create(CreateOptions{Name: "h"})
			if tc.pause {
				if _, err := h.d.Pause(ctx, id); err != nil {
					t.Fatal(err)
				}
			}
			if tc.wake {
				if _, err := h.d.Hibernate(ctx, id); err != nil {
					t.Fatal(err)
				}
				if _, err := h.d.Wake(ctx, id); err != nil {
					t.Fatal(err)
				}
			}
			// What hibernateLocked has done when the daemon dies inside
			// the checkpoint: state recorded, container resumed, no image.
			sb := h.state(id)
			if err := h.d.setState(ctx, sb, store.StateHibernating, ""); err != nil {
				t.Fatal(err)
			}
			if pause {
				if err := h.d.unsuspend(ctx, sb); err != nil {
					t.Fatal(err)
				}
			}
			h.reopen(h.runtimes(RuntimeGVisor, RuntimeCrun))
			if got := h.state(id).State; got != want {
				t.Errorf("after reconcile: state %s, want %s", got, want)
			}
			if s := h.suspended(id); s != pause {
				t.Errorf("after reconcile: suspended %v, want %v", s, pause)
			}
		})
	}
}

// A restart removes hibernation images no live sandbox owns (a crash cut
// their removal: a tombstone, or the whole image of a closed sandbox) and
// keeps the hibernated sandbox's.
func TestReconcileSweepsHibernationImages(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	id := h.create(CreateOptions{})
	if _, err := h.d.Hibernate(ctx, id); err != nil {
		t.Fatal(err)
	}
	stale := []string{h.d.hibernateDir("sb-00000000dead"), h.d.hibernateDir(".rm-sb-00000000beef")}
	for _, dir := range stale {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "checkpoint.img"), []byte("memory"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	h.reopen(h.runtimes(RuntimeGVisor, RuntimeCrun))
	for _, dir := range stale {
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Errorf("%s after a restart: %v, want it removed", dir, err)
		}
	}
	if !h.d.hibernationComplete(id) {
		t.Error("the hibernated sandbox's image was removed")
	}
	if ents, _ := os.ReadDir(h.d.hibernateDir("")); len(ents) != 1 {
		t.Errorf("hibernation images after a restart: %d, want the live one", len(ents))
	}
}
