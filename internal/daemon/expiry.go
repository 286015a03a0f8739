package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/store"
)

// Expiry: one goroutine, owned by the daemon, sleeps on one timer until
// the nearest deadline in the schedule (or the nearest end of an idle
// period), and hands what is due to a few workers; a change to the
// schedule wakes it to recompute. Each expiry re-reads the sandbox under
// its lock, acts only if it is still due, and records sandbox.expired
// (with the reason and the action) before it acts. Deadlines are stored,
// so a sandbox whose deadline passed while the daemon was down is expired
// as soon as the daemon is up again (after reconcile).

const (
	// expiryWorkers is how many expiries run at once.
	expiryWorkers = 4
	// expiryRetry is when an expiry that could not act is tried again.
	expiryRetry = 30 * time.Second
)

// expiryJob is one sandbox to expire: by its deadline, or by idleness.
type expiryJob struct {
	id   string
	idle bool
}

// trackLifetimes puts every live sandbox in the schedule (after
// reconcile, before the scheduler starts).
func (d *Daemon) trackLifetimes(ctx context.Context) error {
	live, err := d.store.ListSandboxes(ctx, false)
	if err != nil {
		return fmt.Errorf("expiry: list sandboxes: %w", err)
	}
	for _, sb := range live {
		switch sb.State {
		case store.StateRunning, store.StatePaused, store.StateHibernated, store.StateDegraded:
			d.life.set(sb.ID, d.ExpiresAt(sb))
			d.touch(sb.ID)
		}
	}
	return nil
}

// startExpiry starts the scheduler and its workers; they stop when ctx is
// cancelled, and Close waits for them.
func (d *Daemon) startExpiry(ctx context.Context) {
	jobs := make(chan expiryJob)
	for range expiryWorkers {
		d.bg.Add(1)
		go func() {
			defer d.bg.Done()
			for {
				select {
				case <-ctx.Done():
					return
				case j := <-jobs:
					d.expire(ctx, j.id, j.idle)
					d.life.expired(j.id)
				}
			}
		}()
	}
	d.bg.Add(1)
	go func() {
		defer d.bg.Done()
		d.runExpiry(ctx, jobs)
	}()
}

// runExpiry is the scheduler loop.
func (d *Daemon) runExpiry(ctx context.Context, jobs chan<- expiryJob) {
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-d.life.kick:
		}
		now := time.Now()
		ids, next := d.life.due(now)
		var todo []expiryJob
		for _, id := range ids {
			todo = append(todo, expiryJob{id: id})
		}
		if d.cfg.IdleTimeout > 0 {
			idle, nextIdle := d.idleDue(now)
			for _, id := range idle {
				todo = append(todo, expiryJob{id: id, idle: true})
			}
			next = earliest(next, nextIdle)
		}
		for _, j := range todo {
			select {
			case <-ctx.Done():
				return
			case jobs <- j:
			}
		}
		// Every change to the schedule wakes the loop: the hour is only a
		// bound on how long it trusts its own arithmetic.
		wait := time.Hour
		if !next.IsZero() {
			wait = max(time.Until(next), 0)
		}
		t.Reset(wait)
	}
}

// idleDue returns the tracked sandboxes idle for the idle timeout at now
// (marked expiring), and when the next idle period ends.
func (d *Daemon) idleDue(now time.Time) (due []string, next time.Time) {
	for _, id := range d.life.idleCandidates() {
		last, busy := d.lastActivity(id, now)
		at := last.Add(d.cfg.IdleTimeout)
		if busy {
			// It ends later than now: look again an idle timeout from now.
			at = now.Add(d.cfg.IdleTimeout)
		} else if !at.After(now) {
			if d.life.markExpiring(id) {
				due = append(due, id)
			}
			continue
		}
		next = earliest(next, at)
	}
	return due, next
}

// earliest is the earlier of two times, zero meaning none.
func earliest(a, b time.Time) time.Time {
	if a.IsZero() || (!b.IsZero() && b.Before(a)) {
		return b
	}
	return a
}

// expire expires one sandbox if, under its lock, it is still due.
func (d *Daemon) expire(ctx context.Context, id string, idle bool) {
	sb, unlock, err := d.locked(ctx, id)
	if err != nil {
		if errdefs.IsNotFound(err) {
			d.life.remove(id)
		} else if ctx.Err() == nil {
			d.log.Warn("expiry: read the sandbox", slog.String("sandbox", id), slog.Any("err", err))
			d.life.set(id, time.Now().Add(expiryRetry))
		}
		return
	}
	defer unlock()
	log := d.log.With(slog.String("sandbox", sb.ID))
	now := time.Now()
	switch sb.State {
	case store.StateClosed, store.StateClosing, store.StateFailed:
		d.life.remove(sb.ID)
		return
	}
	at, reason := d.expiry(sb)
	data := map[string]any{}
	if idle {
		if d.idleFor(sb.ID, now) < d.cfg.IdleTimeout {
			return // busy again: the idle scan looks again later
		}
		reason = reasonIdle
		data["idle_ms"] = d.cfg.IdleTimeout.Milliseconds()
	} else {
		if at.IsZero() || now.Before(at) {
			d.life.set(sb.ID, at) // extended meanwhile
			return
		}
		data["deadline_unix_ms"] = at.UnixMilli()
	}
	action := sb.Config.OnTimeout
	if action == "" {
		action = OnTimeoutClose
	}
	retry := func() {
		if idle {
			d.touch(sb.ID)
		} else {
			d.life.set(sb.ID, now.Add(expiryRetry))
		}
	}
	switch {
	case sb.Pool != "":
		// A warm pool's sandbox is the environment's to manage: its
		// lifetime starts again when it is handed over.
		if !idle {
			d.bestEffort(ctx, "expiry: restart a pooled sandbox's lifetime",
				d.store.SetLifetime(ctx, sb.ID, sb.Config.TimeoutMS, sb.Deadline, now), slog.String("sandbox", sb.ID))
			sb.LifetimeFrom = now
			d.life.set(sb.ID, d.ExpiresAt(sb))
		}
		d.touch(sb.ID)
		return
	case sb.State == store.StateDegraded:
		// Not confirmed healthy: reconcile's recheck deals with it first.
		retry()
		return
	case action == OnTimeoutHibernate && sb.State == store.StateHibernated && idle:
		d.touch(sb.ID)
		return
	}
	data["reason"], data["action"] = reason, action
	if _, err := d.store.AppendEvent(ctx, sb.ID, store.EventSandboxExpired, data); err != nil {
		log.Warn("expiry: record sandbox.expired; tried again later", slog.Any("err", err))
		retry()
		return
	}
	log.Info("sandbox expired", slog.String("reason", reason), slog.String("action", action))
	if action == OnTimeoutClose {
		// Unscheduled first: once the store says closed, nothing is due
		// for it (a close that fails is not retried by expiry either way).
		d.life.remove(sb.ID)
		if err := d.deleteLocked(ctx, sb); err != nil {
			log.Error("expiry: close", slog.Any("err", err))
		}
		return
	}
	if sb.State != store.StateHibernated {
		if err := d.hibernateLocked(ctx, sb); err != nil {
			log.Error("expiry: hibernate; tried again later", slog.Any("err", err))
			retry()
			return
		}
	}
	// Hibernated: nothing runs, nothing is due until a wake, which starts
	// a new lifetime and re-arms the timeout.
	if err := d.store.SetLifetime(ctx, sb.ID, sb.Config.TimeoutMS, time.Time{}, sb.LifetimeFrom); err != nil {
		log.Warn("expiry: clear the deadline of a hibernated sandbox", slog.Any("err", err))
	}
	sb.Deadline = time.Time{}
	d.life.set(sb.ID, d.ExpiresAt(sb))
	d.touch(sb.ID)
}
