package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/store"
)

// Sandbox lifetimes on the real runtimes: expiry closes (nothing left),
// SetTimeout pushes the deadline, forks inherit the timeout and overrides
// replace it, on_timeout hibernate (gVisor) hibernates and an exec wakes,
// and a deadline that passed while the daemon was down expires on start.

// lifetimeWait bounds every wait of these tests (the machine is shared).
const lifetimeWait = 3 * time.Minute

// waitEvent waits until sandbox id's ledger has an event of type typ and
// returns the ledger.
func waitEvent(t *testing.T, id, typ string) []clientEvent {
	t.Helper()
	deadline := time.Now().Add(lifetimeWait)
	for {
		evs, err := env.c.Events(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		if hasEvent(evs, typ) {
			return evs
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s in %s's ledger after %s: %v", typ, id, lifetimeWait, types(evs))
		}
		time.Sleep(100 * time.Millisecond) // a poll interval
	}
}

// checkExpired checks that the ledger records sandbox.expired with the
// action, before the action's own event.
func checkExpired(t *testing.T, evs []clientEvent, action, reason, then string) {
	t.Helper()
	i := slices.IndexFunc(evs, func(e clientEvent) bool { return e.Type == "sandbox.expired" })
	j := slices.IndexFunc(evs, func(e clientEvent) bool { return e.Type == then })
	if i < 0 || j < i {
		t.Fatalf("ledger %v: want sandbox.expired before %s", types(evs), then)
	}
	if evs[i].Data["action"] != action || evs[i].Data["reason"] != reason {
		t.Errorf("sandbox.expired data %v: want action %s, reason %s", evs[i].Data, action, reason)
	}
}

func withTimeout(o client.CreateOptions, d time.Duration, onTimeout string) client.CreateOptions {
	o.Timeout, o.OnTimeout = d, onTimeout
	return o
}

func TestLifetimeExpiryCloses(t *testing.T) {
	forEachRuntime(t, func(t *testing.T) {
		sb := newSandbox(t, withTimeout(clientOpts(), 3*time.Second, ""))
		if sb.Info.TimeoutMs != 3000 || sb.Info.OnTimeout != "close" || sb.ExpiresAt().IsZero() {
			t.Errorf("created: timeout %d, on_timeout %q, expires %v; want 3000, close, set", sb.Info.TimeoutMs, sb.Info.OnTimeout, sb.ExpiresAt())
		}
		evs := waitEvent(t, sb.ID, "sandbox.closed")
		checkExpired(t, evs, "close", "timeout", "sandbox.closed")
		if err := sb.Refresh(context.Background()); err != nil || sb.Info.State != "closed" {
			t.Errorf("after expiry: %q, %v; want closed", sb.Info.GetState(), err)
		}
		checkNoLeftovers(t, sb.ID)
	})
}

func TestLifetimeExtend(t *testing.T) {
	forEachRuntime(t, func(t *testing.T) {
		ctx := context.Background()
		// The first deadline is set once the sandbox is up (a create may be
		// slow on a loaded machine), then extended right away. A host that
		// spends the first timeout between the two calls has the sandbox
		// expire before its extension: that try proves nothing, and a new
		// sandbox tries again with twice the first timeout.
		var (
			sb            *client.Sandbox
			first, before time.Time
		)
		for short := 8 * time.Second; ; short *= 2 {
			sb = newSandbox(t, withTimeout(clientOpts(), time.Hour, ""))
			if err := sb.SetTimeout(ctx, short); err != nil {
				t.Fatal(err)
			}
			first = sb.ExpiresAt()
			// Deadlines are kept in milliseconds: the daemon's "now" (after
			// this one) may round down below it by less than that.
			before = time.Now().Truncate(time.Millisecond)
			err := sb.SetTimeout(ctx, time.Hour)
			if err == nil {
				break
			}
			if !errdefs.IsFailedPrecondition(err) || time.Now().Before(first) || short >= 2*time.Minute {
				t.Fatalf("extended %s after a %s timeout was set: %v", time.Since(before), short, err)
			}
		}
		if at := sb.ExpiresAt(); at.Before(before.Add(time.Hour)) {
			t.Errorf("after SetTimeout(1h): expires %v, want at least %v", at, before.Add(time.Hour))
		}
		// The CLI: forkbox timeout prints the new deadline.
		out, err := exec.Command(env.bin, "--host", "unix://"+env.socket, "--json", "timeout", sb.ID, "2h").Output()
		if err != nil {
			t.Fatalf("forkbox timeout: %v", err)
		}
		var shown struct {
			ExpiresAtUnixMs int64  `json:"expires_at_unix_ms"`
			ExpiresAt       string `json:"expires_at"`
		}
		if err := json.Unmarshal(out, &shown); err != nil || shown.ExpiresAt == "" ||
			time.UnixMilli(shown.ExpiresAtUnixMs).Before(before.Add(2*time.Hour)) {
			t.Errorf("forkbox timeout --json: %s (%v); want expires_at after %v", out, err, before.Add(2*time.Hour))
		}
		insp, err := exec.Command(env.bin, "--host", "unix://"+env.socket, "inspect", sb.ID).Output()
		shown.ExpiresAt = ""
		if err != nil {
			t.Fatalf("forkbox inspect: %v", err)
		}
		if err := json.Unmarshal(insp, &shown); err != nil || shown.ExpiresAt == "" {
			t.Errorf("forkbox inspect: %s (%v); want expires_at", insp, err)
		}
		// A witness expiring after the first deadline: once it is closed,
		// the scheduler has passed that deadline, and the extended
		// sandbox must still be running.
		witness := newSandbox(t, withTimeout(clientOpts(), max(time.Until(first)+time.Second, time.Millisecond), ""))
		waitEvent(t, witness.ID, "sandbox.closed")
		if out := mustSh(t, sb, "echo alive"); out != "alive\n" {
			t.Errorf("extended sandbox: %q", out)
		}
		evs, _ := sb.Events(ctx)
		if hasEvent(evs, "sandbox.expired") || !hasEvent(evs, "sandbox.timeout_set") {
			t.Errorf("extended sandbox's ledger %v: want sandbox.timeout_set, no sandbox.expired", types(evs))
		}
		if err := sb.SetTimeout(ctx, -time.Second); !errdefs.IsInvalidArgument(err) {
			t.Errorf("negative timeout: got %v, want InvalidArgument", err)
		}
	})
}

func TestLifetimeForkInherits(t *testing.T) {
	forEachRuntime(t, func(t *testing.T) {
		ctx := context.Background()
		src := newSandbox(t, withTimeout(clientOpts(), time.Hour, ""))
		res, err := src.Fork(ctx, client.ForkOptions{Tag: "life"})
		if err != nil || res.Children[0].Err != nil {
			t.Fatalf("fork: %v, %+v", err, res)
		}
		child := res.Children[0].Sandbox
		t.Cleanup(func() { child.Close(context.Background()) })
		// The child's deadline is its own start plus the inherited hour.
		if child.Info.TimeoutMs != time.Hour.Milliseconds() || child.ExpiresAt().Before(src.ExpiresAt()) ||
			child.ExpiresAt().Sub(time.UnixMilli(child.Info.CreatedAtUnixMs)) < time.Hour-30*time.Second {
			t.Errorf("child: timeout %d, expires %v (source %v, created %v); want 1h from its start",
				child.Info.TimeoutMs, child.ExpiresAt(), src.ExpiresAt(), time.UnixMilli(child.Info.CreatedAtUnixMs))
		}
		res, err = src.Fork(ctx, client.ForkOptions{FromCheckpoint: res.Checkpoint.Id, Overrides: client.Overrides{Timeout: 3 * time.Second}})
		if err != nil || res.Children[0].Err != nil {
			t.Fatalf("fork with a timeout override: %v, %+v", err, res)
		}
		short := res.Children[0].Sandbox
		t.Cleanup(func() { short.Close(context.Background()) })
		if short.Info.TimeoutMs != 3000 {
			t.Errorf("overridden child: timeout %d, want 3000", short.Info.TimeoutMs)
		}
		evs := waitEvent(t, short.ID, "sandbox.closed")
		checkExpired(t, evs, "close", "timeout", "sandbox.closed")
		checkNoLeftovers(t, short.ID)
		if out := mustSh(t, src, "echo src"); out != "src\n" {
			t.Errorf("source after its child's expiry: %q", out)
		}
	})
}

func TestLifetimeHibernate(t *testing.T) {
	ctx := context.Background()
	_, err := env.c.CreateSandbox(ctx, client.CreateOptions{Image: env.image, Runtime: "crun", Timeout: time.Minute, OnTimeout: "hibernate"})
	if !errdefs.IsInvalidArgument(err) {
		t.Errorf("crun with on_timeout hibernate: got %v, want InvalidArgument", err)
	}
	o := clientOpts()
	o.Runtime = "gvisor"
	// The file is written before the timeout is short: the expiry comes
	// after the write however slow the host.
	sb := newSandbox(t, withTimeout(o, time.Hour, "hibernate"))
	mustSh(t, sb, "echo kept > /root/f")
	if err := sb.SetTimeout(ctx, 3*time.Second); err != nil {
		t.Fatal(err)
	}
	evs := waitEvent(t, sb.ID, "sandbox.hibernated")
	checkExpired(t, evs, "hibernate", "timeout", "sandbox.hibernated")
	if err := sb.Refresh(ctx); err != nil || sb.Info.State != "hibernated" || sb.Info.ExpiresAtUnixMs != 0 {
		t.Fatalf("after expiry: %q, expires %d, %v; want hibernated, no deadline", sb.Info.GetState(), sb.Info.ExpiresAtUnixMs, err)
	}
	// Woken, its timeout counts again: it expires a second time. Woken by
	// Wake, not by an exec, which the expiry would cut if it came first.
	if err := sb.Wake(ctx); err != nil {
		t.Fatal(err)
	}
	count := func(typ string) int {
		n := 0
		for _, e := range evs {
			if e.Type == typ {
				n++
			}
		}
		return n
	}
	deadline := time.Now().Add(lifetimeWait)
	for evs, _ = sb.Events(ctx); count("sandbox.hibernated") < 2; evs, _ = sb.Events(ctx) {
		if time.Now().After(deadline) {
			t.Fatalf("no second sandbox.hibernated after the wake: %v", types(evs))
		}
		time.Sleep(100 * time.Millisecond) // a poll interval
	}
	if n := count("sandbox.expired"); n != 2 {
		t.Fatalf("ledger %v: want sandbox.expired before each sandbox.hibernated", types(evs))
	}
	// An exec wakes it (an hour's timeout now, so that no expiry cuts
	// the exec), with its files as they were.
	if err := sb.SetTimeout(ctx, time.Hour); err != nil {
		t.Fatal(err)
	}
	if out := mustSh(t, sb, "cat /root/f"); out != "kept\n" {
		t.Errorf("after the exec woke it: %q", out)
	}
	evs, _ = sb.Events(ctx)
	if n := count("sandbox.woken"); n != 2 {
		t.Errorf("ledger %v: want sandbox.woken twice (Wake, then the exec)", types(evs))
	}
}

// TestLifetimeAcrossRestart: a deadline that passed while the daemon was
// down expires the sandbox once the daemon is up again (after its
// reconcile). The deadline is an hour away while the daemon runs (no
// expiry can come before the stop, however slow the host), and is moved
// back by that hour in the store of the stopped daemon.
func TestLifetimeAcrossRestart(t *testing.T) {
	forEachRuntime(t, func(t *testing.T) {
		sb := newSandbox(t, withTimeout(clientOpts(), time.Hour, ""))
		if err := stopDaemon(syscall.SIGTERM); err != nil {
			t.Fatalf("daemon exit: %v", err)
		}
		moved := moveDeadlineBack(sb.ID, sb.ExpiresAt(), time.Hour)
		if err := startDaemon(); err != nil {
			t.Fatal(err)
		}
		if moved != nil {
			t.Fatal(moved)
		}
		evs := waitEvent(t, sb.ID, "sandbox.closed")
		checkExpired(t, evs, "close", "timeout", "sandbox.closed")
		ts := types(evs)
		if r, e := slices.Index(ts, "sandbox.recovered"), slices.Index(ts, "sandbox.expired"); r < 0 || r > e {
			t.Errorf("ledger %v: want sandbox.recovered (the restart's reconcile) before sandbox.expired", ts)
		}
		checkNoLeftovers(t, sb.ID)
	})
}

// moveDeadlineBack moves sandbox id's deadline, which must be want, back
// by d in the store of the stopped daemon.
func moveDeadlineBack(id string, want time.Time, d time.Duration) error {
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(env.stateDir, "forkbox.db"))
	if err != nil {
		return err
	}
	defer st.Close()
	sb, err := st.GetSandbox(ctx, id)
	if err != nil {
		return err
	}
	if !sb.Deadline.Equal(want) {
		return fmt.Errorf("stored deadline %v, want %v (the daemon's)", sb.Deadline, want)
	}
	return st.SetLifetime(ctx, id, sb.Config.TimeoutMS, sb.Deadline.Add(-d), sb.LifetimeFrom)
}
