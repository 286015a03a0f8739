package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/store"
)

// Lifetimes: a sandbox may have a timeout (from its create, or inherited
// by the children of its checkpoints). Its deadline is its start plus the
// timeout, or the time of the last SetTimeout plus the new one. The
// daemon's MaxLifetime caps every deadline at the start of the sandbox's
// lifetime (its start, or its last wake) plus MaxLifetime; its IdleTimeout
// expires a sandbox that had no exec or file activity for that long. At
// expiry the sandbox is closed, or hibernated (OnTimeout "hibernate",
// gvisor only); while hibernated only its own deadline counts, and a wake
// starts a new lifetime (and re-arms the timeout an expiry cleared).
// Expiry itself is expiry.go.

// On-timeout actions.
const (
	OnTimeoutClose     = "close"
	OnTimeoutHibernate = "hibernate"
)

// maxTimeout bounds a caller's timeout.
const maxTimeout = 366 * 24 * time.Hour

// Why a sandbox expired (the reason in its sandbox.expired event).
const (
	reasonTimeout     = "timeout"
	reasonMaxLifetime = "max_lifetime"
	reasonIdle        = "idle"
)

// checkTimeout checks a caller's timeout and on-timeout action.
func checkTimeout(timeout time.Duration, onTimeout string) error {
	if timeout < 0 || timeout > maxTimeout {
		return fmt.Errorf("timeout %s: want 0 (none) up to %s: %w", timeout, maxTimeout, errdefs.ErrInvalidArgument)
	}
	switch onTimeout {
	case "", OnTimeoutClose, OnTimeoutHibernate:
		return nil
	}
	return fmt.Errorf("on_timeout %q: want close or hibernate: %w", onTimeout, errdefs.ErrInvalidArgument)
}

// checkOnTimeout refuses a hibernate action on a runtime that cannot
// hibernate: the sandbox would be found unable to at its expiry.
func (d *Daemon) checkOnTimeout(cfg store.SandboxConfig, runtime string) error {
	if cfg.OnTimeout != OnTimeoutHibernate {
		return nil
	}
	if _, _, err := d.memoryRuntime(&store.Sandbox{ID: "(new)", Runtime: runtime}); err != nil {
		return fmt.Errorf("on_timeout hibernate: runtime %s cannot hibernate (use gvisor, or on_timeout close): %w", runtime, errdefs.ErrInvalidArgument)
	}
	return nil
}

// expiry returns when a sandbox expires (zero: never) and why, its idle
// timeout aside.
func (d *Daemon) expiry(sb *store.Sandbox) (time.Time, string) {
	at, why := sb.Deadline, reasonTimeout
	hibernated := sb.State == store.StateHibernated || sb.State == store.StateHibernating
	if hibernated && sb.Config.OnTimeout == OnTimeoutHibernate {
		// Already what its expiry would make it: nothing is due until a
		// wake re-arms the timeout. Said from the state alone, so no
		// reader sees a hibernated sandbox with a deadline still set
		// while the expiry that hibernated it clears it.
		return time.Time{}, why
	}
	if d.cfg.MaxLifetime > 0 && !hibernated {
		if c := sb.LifetimeFrom.Add(d.cfg.MaxLifetime); at.IsZero() || c.Before(at) {
			at, why = c, reasonMaxLifetime
		}
	}
	return at, why
}

// ExpiresAt returns when a sandbox expires (zero: never), its idle timeout
// aside: its deadline capped by the daemon's max lifetime.
func (d *Daemon) ExpiresAt(sb *store.Sandbox) time.Time {
	if sb.State == store.StateClosed {
		return time.Time{}
	}
	at, _ := d.expiry(sb)
	return at
}

// SetTimeout sets a live sandbox's timeout and its deadline to now plus
// it (0: no timeout of its own); the daemon's max lifetime still caps it
// (see ExpiresAt for the effective deadline).
func (d *Daemon) SetTimeout(ctx context.Context, idOrName string, timeout time.Duration) (*store.Sandbox, error) {
	if err := checkTimeout(timeout, ""); err != nil {
		return nil, err
	}
	sb, unlock, err := d.locked(ctx, idOrName)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if err := requireState(sb, "set the timeout of", store.StateRunning, store.StatePaused, store.StateHibernated, store.StateDegraded); err != nil {
		return nil, err
	}
	var deadline time.Time
	if timeout > 0 {
		deadline = time.Now().Add(timeout)
	}
	if err := d.store.SetLifetime(ctx, sb.ID, timeout.Milliseconds(), deadline, sb.LifetimeFrom); err != nil {
		return nil, err
	}
	sb.Config.TimeoutMS, sb.Deadline = timeout.Milliseconds(), deadline
	at := d.ExpiresAt(sb)
	d.life.set(sb.ID, at)
	d.note(ctx, sb.ID, store.EventTimeoutSet, map[string]any{"timeout_ms": timeout.Milliseconds(), "expires_at_unix_ms": unixMilli(at)})
	return sb, nil
}

// restartLifetime starts a new lifetime for a woken sandbox, and re-arms
// its timeout if an expiry cleared its deadline or would have.
func (d *Daemon) restartLifetime(ctx context.Context, sb *store.Sandbox) {
	now := time.Now()
	deadline := sb.Deadline
	// Cleared by the expiry that hibernated it, or passed while it slept
	// with on_timeout hibernate (its expiry found it already hibernated).
	passed := !deadline.IsZero() && !deadline.After(now) && sb.Config.OnTimeout == OnTimeoutHibernate
	if (deadline.IsZero() || passed) && sb.Config.TimeoutMS > 0 {
		deadline = now.Add(time.Duration(sb.Config.TimeoutMS) * time.Millisecond)
	}
	if err := d.store.SetLifetime(ctx, sb.ID, sb.Config.TimeoutMS, deadline, now); err != nil {
		d.bestEffort(ctx, "restart the lifetime of a woken sandbox", err, slog.String("sandbox", sb.ID))
		return
	}
	sb.Deadline, sb.LifetimeFrom = deadline, now
	d.life.set(sb.ID, d.ExpiresAt(sb))
}

func unixMilli(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}
