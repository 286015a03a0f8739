package daemon

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/agent"
	"github.com/forkbox/forkbox/internal/store"
)

// waitUntil polls cond until it holds, failing the test after a generous
// deadline.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond) // a poll interval, not a synchronisation
	}
}

// expiredEvent returns the data of a sandbox's sandbox.expired event, and
// checks it comes before what the action records.
func (h *harness) expiredEvent(id, then string) map[string]any {
	h.t.Helper()
	evs, err := h.d.store.Events(context.Background(), id)
	if err != nil {
		h.t.Fatal(err)
	}
	at := -1
	for i, e := range evs {
		if e.Type == store.EventSandboxExpired {
			at = i
		}
	}
	if at < 0 {
		h.t.Fatalf("no %s in %v", store.EventSandboxExpired, h.events(id))
	}
	if !slices.Contains(h.events(id)[at:], then) {
		h.t.Errorf("no %s after %s: %v", then, store.EventSandboxExpired, h.events(id))
	}
	return evs[at].Data
}

func (h *harness) waitState(id string, want store.State) {
	h.t.Helper()
	waitUntil(h.t, "sandbox "+id+" "+string(want), func() bool { return h.state(id).State == want })
}

// A sandbox whose timeout passes is closed, after sandbox.expired; a
// sandbox without one is not, and the scheduler keeps no entry of a
// closed sandbox.
func TestExpiryCloses(t *testing.T) {
	h := newHarness(t)
	keep := h.create(CreateOptions{Name: "keep"})
	id := h.create(CreateOptions{Name: "short", Timeout: 100 * time.Millisecond})
	sb := h.state(id)
	if sb.Config.TimeoutMS != 100 || sb.Deadline.Sub(sb.LifetimeFrom) != 100*time.Millisecond {
		t.Fatalf("timeout %d ms, deadline %v after start; want 100 ms, 100ms", sb.Config.TimeoutMS, sb.Deadline.Sub(sb.LifetimeFrom))
	}
	h.waitState(id, store.StateClosed)
	data := h.expiredEvent(id, store.EventSandboxClosed)
	if data["reason"] != reasonTimeout || data["action"] != OnTimeoutClose {
		t.Errorf("expired event %v: want reason timeout, action close", data)
	}
	if h.w.status(id) != "" {
		t.Errorf("expired sandbox's container: %q, want none", h.w.status(id))
	}
	if _, ok := h.d.life.deadline(id); ok {
		t.Error("a closed sandbox is still scheduled")
	}
	if got := h.state(keep).State; got != store.StateRunning {
		t.Errorf("sandbox without a timeout: %s, want running", got)
	}
	if h.d.ExpiresAt(h.state(keep)) != (time.Time{}) {
		t.Errorf("sandbox without a timeout expires at %v, want never", h.d.ExpiresAt(h.state(keep)))
	}
}

// SetTimeout moves the deadline to now + timeout: a sandbox extended past
// its first deadline outlives a witness that expires after that deadline.
func TestSetTimeoutExtends(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	// A first deadline 2 s away (not counted from the create, which may
	// be slow on a loaded machine), extended right away. A host that
	// spends the first timeout between the two calls has the sandbox
	// expire before its extension: that try proves nothing, and a new
	// sandbox tries again with twice the first timeout.
	var (
		id            string
		sb            *store.Sandbox
		first, before time.Time
	)
	for short := 2 * time.Second; ; short *= 2 {
		id = h.create(CreateOptions{Name: fmt.Sprintf("ext-%d", short/time.Second), Timeout: time.Hour})
		set, err := h.d.SetTimeout(ctx, id, short)
		if err != nil {
			t.Fatal(err)
		}
		first, before = set.Deadline, time.Now()
		sb, err = h.d.SetTimeout(ctx, id, time.Hour)
		if err == nil {
			break
		}
		if !errdefs.IsFailedPrecondition(err) || time.Now().Before(first) || short >= time.Minute {
			t.Fatalf("extended %s after a %s timeout was set: %v", time.Since(before), short, err)
		}
	}
	if at := h.d.ExpiresAt(sb); at.Before(before.Add(time.Hour)) || at.After(time.Now().Add(time.Hour)) {
		t.Errorf("expires at %v, want now + 1h", at)
	}
	if got := h.state(id); got.Config.TimeoutMS != time.Hour.Milliseconds() || !got.Deadline.Equal(time.UnixMilli(sb.Deadline.UnixMilli())) {
		t.Errorf("stored timeout %d deadline %v; want 1h, %v", got.Config.TimeoutMS, got.Deadline, sb.Deadline)
	}
	// Its deadline is after first however long its create takes.
	witness := h.create(CreateOptions{Name: "witness", Timeout: max(time.Until(first)+100*time.Millisecond, time.Millisecond)})
	h.waitState(witness, store.StateClosed)
	if got := h.state(id).State; got != store.StateRunning {
		t.Fatalf("extended sandbox: %s, want running", got)
	}
	if !slices.Contains(h.events(id), store.EventTimeoutSet) || slices.Contains(h.events(id), store.EventSandboxExpired) {
		t.Errorf("events %v: want timeout_set, no expired", h.events(id))
	}
	// 0 removes the sandbox's own timeout.
	if sb, err := h.d.SetTimeout(ctx, id, 0); err != nil || !h.d.ExpiresAt(sb).IsZero() {
		t.Errorf("SetTimeout 0: expires at %v, %v; want never", h.d.ExpiresAt(sb), err)
	}
	for _, bad := range []time.Duration{-time.Second, maxTimeout + time.Hour} {
		if _, err := h.d.SetTimeout(ctx, id, bad); !errdefs.IsInvalidArgument(err) {
			t.Errorf("SetTimeout %v: got %v, want InvalidArgument", bad, err)
		}
	}
	if _, err := h.d.SetTimeout(ctx, witness, time.Hour); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("SetTimeout of a closed sandbox: got %v, want FailedPrecondition", err)
	}
	if _, err := h.d.SetTimeout(ctx, "sb-nope", time.Hour); !errdefs.IsNotFound(err) {
		t.Errorf("SetTimeout of an unknown sandbox: got %v, want NotFound", err)
	}
}

// The daemon's max lifetime caps every deadline at the lifetime's start
// plus the cap: a longer timeout, no timeout, and an extension alike.
func TestMaxLifetimeClamps(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	h.cfg.MaxLifetime = time.Hour
	h.reopen(h.runtimes(RuntimeGVisor, RuntimeCrun))
	for _, tc := range []struct {
		name    string
		timeout time.Duration
		want    time.Duration // after the lifetime's start
		reason  string
	}{
		{"no timeout", 0, time.Hour, reasonMaxLifetime},
		{"longer", 3 * time.Hour, time.Hour, reasonMaxLifetime},
		{"shorter", 10 * time.Minute, 10 * time.Minute, reasonTimeout},
	} {
		sb, err := h.d.Create(ctx, CreateOptions{Image: "unit:1", Name: "c-" + tc.name[:2], Timeout: tc.timeout})
		if err != nil {
			t.Fatal(err)
		}
		at, why := h.d.expiry(sb)
		if got := at.Sub(sb.LifetimeFrom); got != tc.want || why != tc.reason {
			t.Errorf("%s: expires %v after start (%s), want %v (%s)", tc.name, got, why, tc.want, tc.reason)
		}
		if dl, _ := h.d.life.deadline(sb.ID); !dl.Equal(at) {
			t.Errorf("%s: scheduled %v, want %v", tc.name, dl, at)
		}
	}
	id := h.create(CreateOptions{Name: "ext", Timeout: time.Minute})
	sb, err := h.d.SetTimeout(ctx, id, 5*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if got := h.d.ExpiresAt(sb).Sub(sb.LifetimeFrom); got != time.Hour {
		t.Errorf("extended past the cap: expires %v after start, want 1h", got)
	}
	// A lifetime past the cap expires the sandbox, reason max_lifetime.
	h.cfg.MaxLifetime = 200 * time.Millisecond
	h.reopen(h.runtimes(RuntimeGVisor, RuntimeCrun))
	h.waitState(id, store.StateClosed)
	if data := h.expiredEvent(id, store.EventSandboxClosed); data["reason"] != reasonMaxLifetime {
		t.Errorf("expired event %v: want reason max_lifetime", data)
	}
}

// Children inherit the timeout (their deadline counts from their own
// start) and the action; the fork's or restore's overrides replace them.
func TestForkInheritsTimeout(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	src := h.create(CreateOptions{Name: "src", Timeout: time.Hour, OnTimeout: OnTimeoutHibernate})
	res, err := h.d.Fork(ctx, ForkOptions{Source: src})
	if err != nil || res.Children[0].Err != nil {
		t.Fatalf("fork: %v, %+v", err, res)
	}
	child := res.Children[0].Sandbox
	if child.Config.TimeoutMS != time.Hour.Milliseconds() || child.Config.OnTimeout != OnTimeoutHibernate ||
		child.Deadline.Sub(child.LifetimeFrom) != time.Hour || !child.LifetimeFrom.After(h.state(src).LifetimeFrom) {
		t.Errorf("child: timeout %d %q, deadline %v after its start %v; want 1h hibernate, 1h, after the source's",
			child.Config.TimeoutMS, child.Config.OnTimeout, child.Deadline.Sub(child.LifetimeFrom), child.LifetimeFrom)
	}
	res, err = h.d.Fork(ctx, ForkOptions{Source: src, FromCheckpoint: res.Checkpoint.ID,
		Overrides: Overrides{Timeout: 100 * time.Millisecond, OnTimeout: OnTimeoutClose}})
	if err != nil || res.Children[0].Err != nil {
		t.Fatalf("fork with overrides: %v, %+v", err, res)
	}
	over := res.Children[0].Sandbox
	h.waitState(over.ID, store.StateClosed)
	if data := h.expiredEvent(over.ID, store.EventSandboxClosed); data["action"] != OnTimeoutClose {
		t.Errorf("overridden child's expiry %v: want action close", data)
	}
	rs, err := h.d.RestoreSnapshot(ctx, res.Checkpoint.ID, Overrides{Timeout: 2 * time.Hour}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if rs.Config.TimeoutMS != (2*time.Hour).Milliseconds() || rs.Config.OnTimeout != OnTimeoutHibernate {
		t.Errorf("restore: timeout %d %q, want 2h hibernate (inherited)", rs.Config.TimeoutMS, rs.Config.OnTimeout)
	}
	if h.state(src).State != store.StateRunning {
		t.Errorf("source: %s, want running", h.state(src).State)
	}
}

// on_timeout hibernate: refused on crun, everywhere a sandbox starts;
// on gvisor the expiry hibernates, the deadline is cleared while
// hibernated, and a wake (Wake, or an exec) re-arms its timeout, which
// expires it again.
func TestExpiryHibernates(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	if _, err := h.d.Create(ctx, CreateOptions{Image: "unit:1", Runtime: RuntimeCrun, OnTimeout: OnTimeoutHibernate}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("crun with on_timeout hibernate: got %v, want InvalidArgument", err)
	}
	crun := h.create(CreateOptions{Name: "crun", Runtime: RuntimeCrun})
	if _, err := h.d.Fork(ctx, ForkOptions{Source: crun, Overrides: Overrides{OnTimeout: OnTimeoutHibernate}}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("crun fork with on_timeout hibernate: got %v, want InvalidArgument", err)
	}
	id := h.create(CreateOptions{Name: "hib", Timeout: 200 * time.Millisecond, OnTimeout: OnTimeoutHibernate})
	h.waitState(id, store.StateHibernated)
	data := h.expiredEvent(id, store.EventHibernated)
	if data["action"] != OnTimeoutHibernate || data["reason"] != reasonTimeout {
		t.Errorf("expired event %v: want action hibernate, reason timeout", data)
	}
	if at := h.d.ExpiresAt(h.state(id)); !at.IsZero() {
		t.Errorf("hibernated by expiry: expires at %v, want never until woken", at)
	}
	count := func(typ string) int {
		n := 0
		for _, e := range h.events(id) {
			if e == typ {
				n++
			}
		}
		return n
	}
	// rearm sets the timeout that the next wake re-arms, once the expiry
	// has cleared the deadline (its last write).
	rearm := func(timeout time.Duration) {
		t.Helper()
		waitUntil(t, "the expiry to clear the deadline", func() bool { return h.state(id).Deadline.IsZero() })
		if err := h.d.store.SetLifetime(ctx, id, timeout.Milliseconds(), time.Time{}, h.state(id).LifetimeFrom); err != nil {
			t.Fatal(err)
		}
	}
	// Woken, its timeout is re-armed from the wake: it expires again.
	// Woken by Wake, not by an exec, which the expiry would cut if it
	// came first.
	const short = 200 * time.Millisecond
	rearm(short)
	woken, err := h.d.Wake(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if got := woken.Deadline.Sub(woken.LifetimeFrom); got != short {
		t.Errorf("woken: deadline %v after its new start, want %s", got, short)
	}
	waitUntil(t, "the second expiry", func() bool { return count(store.EventSandboxExpired) == 2 })
	h.waitState(id, store.StateHibernated)
	// An exec wakes it, and re-arms its timeout too: an hour, so that no
	// expiry cuts the exec however slow the host.
	rearm(time.Hour)
	res, err := h.d.Exec(ctx, id, ExecOptions{ExecRequest: agent.ExecRequest{Argv: []string{"true"}}}, nil, nil)
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("exec on the hibernated sandbox: %+v, %v", res, err)
	}
	if n := count(store.EventWoken); n != 2 {
		t.Errorf("events %v: want sandbox.woken twice", h.events(id))
	}
	if woken := h.state(id); woken.State != store.StateRunning || woken.Deadline.Sub(woken.LifetimeFrom) != time.Hour {
		t.Errorf("woken by an exec: %s, deadline %v after its new start; want running, 1h", woken.State, woken.Deadline.Sub(woken.LifetimeFrom))
	}
}

// A sandbox with on_timeout hibernate that is hibernated has nothing due,
// whatever deadline is stored, and a deadline that passed while it slept
// is re-armed when it wakes, not met at once.
func TestHibernatedNothingDue(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	id := h.create(CreateOptions{Name: "hib", Timeout: time.Hour, OnTimeout: OnTimeoutHibernate})
	if _, err := h.d.Hibernate(ctx, id); err != nil {
		t.Fatal(err)
	}
	sb := h.state(id)
	if at := h.d.ExpiresAt(sb); !at.IsZero() {
		t.Errorf("hibernated with on_timeout hibernate: expires at %v, want never until woken", at)
	}
	if err := h.d.store.SetLifetime(ctx, id, sb.Config.TimeoutMS, time.Now().Add(-time.Minute), sb.LifetimeFrom); err != nil {
		t.Fatal(err)
	}
	if _, err := h.d.Wake(ctx, id); err != nil {
		t.Fatal(err)
	}
	if at := h.d.ExpiresAt(h.state(id)); time.Until(at) < 30*time.Minute {
		t.Errorf("woken after its deadline passed: expires at %v (in %s), want its hour re-armed", at, time.Until(at))
	}
	if st := h.state(id).State; st != store.StateRunning {
		t.Errorf("woken: %s, want running", st)
	}
}

// A deadline that passed while the daemon was down expires the sandbox
// when it is up again. Its deadline is an hour away while the daemon runs
// (no expiry can come before the restart, however slow the host), and is
// moved back by that hour while the daemon is down.
func TestExpiryAcrossRestart(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	id := h.create(CreateOptions{Name: "r"})
	sb, err := h.d.SetTimeout(ctx, id, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.d.Close(); err != nil {
		t.Fatal(err)
	}
	h.d = nil
	st, err := store.Open(ctx, filepath.Join(h.cfg.StateDir, "forkbox.db"))
	if err != nil {
		t.Fatal(err)
	}
	stored, err := st.GetSandbox(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if !stored.Deadline.Equal(time.UnixMilli(sb.Deadline.UnixMilli())) {
		t.Fatalf("stored deadline %v, want SetTimeout's %v", stored.Deadline, sb.Deadline)
	}
	deadline := stored.Deadline.Add(-time.Hour)
	if err := st.SetLifetime(ctx, id, stored.Config.TimeoutMS, deadline, stored.LifetimeFrom); err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the wall clock past the deadline", func() bool { return time.Now().After(deadline) })
	h.reopen(h.runtimes(RuntimeGVisor, RuntimeCrun))
	h.waitState(id, store.StateClosed)
	evs := h.events(id)
	if i := slices.Index(evs, store.EventSandboxFound); i < 0 || i > slices.Index(evs, store.EventSandboxExpired) {
		t.Errorf("events %v: want sandbox.recovered (reconcile) before sandbox.expired", evs)
	}
	h.expiredEvent(id, store.EventSandboxClosed)
}

// The idle timeout expires a sandbox with no activity, not one with an
// exec in flight. The timeout is an hour (the busy sandbox's exec starts
// first however slow the host); the last activity of both sandboxes is
// then moved back past it.
func TestIdleTimeout(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	h.cfg.IdleTimeout = time.Hour
	h.reopen(h.runtimes(RuntimeGVisor, RuntimeCrun))
	busy := h.create(CreateOptions{Name: "busy"})
	done := make(chan error, 1)
	ectx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		_, err := h.d.Exec(ectx, busy, ExecOptions{ExecRequest: agent.ExecRequest{Shell: "sleep 3600", Timeout: time.Hour}}, nil, nil)
		done <- err
	}()
	waitUntil(t, "the exec in flight", func() bool { _, b := h.d.lastActivity(busy, time.Now()); return b })
	id := h.create(CreateOptions{Name: "idle"})
	a := h.d.act()
	a.mu.Lock()
	a.last[busy], a.last[id] = time.Now().Add(-2*time.Hour), time.Now().Add(-2*time.Hour)
	a.mu.Unlock()
	h.d.life.wake() // the scheduler looks again
	h.waitState(id, store.StateClosed)
	if data := h.expiredEvent(id, store.EventSandboxClosed); data["reason"] != reasonIdle {
		t.Errorf("expired event %v: want reason idle", data)
	}
	if got := h.state(busy).State; got != store.StateRunning {
		t.Errorf("sandbox with an exec in flight: %s, want running", got)
	}
	cancel()
	<-done
}
