package daemon

import (
	"context"
	"sync"
	"time"

	"github.com/forkbox/forkbox/internal/store"
)

// Idle hibernation: with Config.IdleHibernate set, a running sandbox (on a
// runtime that can checkpoint memory) that has had no exec, file operation
// or wake for that long, and has none in flight, is hibernated; its next
// exec wakes it. Activity is tracked in memory: after a daemon restart every
// sandbox starts a new idle period.

type activity struct {
	mu       sync.Mutex
	last     map[string]time.Time
	inFlight map[string]int
	ptys     map[string]int // pty sessions open, per sandbox
}

func (d *Daemon) act() *activity {
	d.actOnce.Do(func() {
		d.activity = &activity{last: map[string]time.Time{}, inFlight: map[string]int{}, ptys: map[string]int{}}
	})
	return d.activity
}

// busy marks an operation on sandbox id; call the returned func when done.
func (d *Daemon) busy(id string) func() {
	a := d.act()
	a.mu.Lock()
	a.inFlight[id]++
	a.last[id] = time.Now()
	a.mu.Unlock()
	return func() {
		a.mu.Lock()
		a.inFlight[id]--
		a.last[id] = time.Now()
		a.mu.Unlock()
	}
}

// idleFor returns how long sandbox id has been idle (0 if busy).
func (d *Daemon) idleFor(id string, now time.Time) time.Duration {
	a := d.act()
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.inFlight[id] > 0 {
		return 0
	}
	last, ok := a.last[id]
	if !ok {
		a.last[id] = now
		return 0
	}
	return now.Sub(last)
}

// lastActivity returns when sandbox id last ended an operation (now if it
// was never seen) and whether one is in flight.
func (d *Daemon) lastActivity(id string, now time.Time) (time.Time, bool) {
	a := d.act()
	a.mu.Lock()
	defer a.mu.Unlock()
	last, ok := a.last[id]
	if !ok {
		a.last[id], last = now, now
	}
	return last, a.inFlight[id] > 0
}

// touch starts a new idle period for sandbox id.
func (d *Daemon) touch(id string) {
	a := d.act()
	a.mu.Lock()
	a.last[id] = time.Now()
	a.mu.Unlock()
}

func (d *Daemon) startIdleHibernation(ctx context.Context) {
	if d.cfg.IdleHibernate <= 0 {
		return
	}
	every := max(min(d.cfg.IdleHibernate/2, 30*time.Second), 100*time.Millisecond)
	d.bg.Add(1)
	go func() {
		defer d.bg.Done()
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case now := <-t.C:
				d.hibernateIdle(ctx, now)
			}
		}
	}()
}

// hibernateIdle hibernates every sandbox idle at now for the configured
// time; a sandbox it skipped (busy again, or not running under its lock)
// gets no event.
func (d *Daemon) hibernateIdle(ctx context.Context, now time.Time) {
	running, err := d.store.ListSandboxesInState(ctx, store.StateRunning)
	if err != nil {
		d.bestEffort(ctx, "idle hibernation: list sandboxes", err)
		return
	}
	for _, sb := range running {
		if sb.Pool != "" || d.idleFor(sb.ID, now) < d.cfg.IdleHibernate {
			continue
		}
		if _, _, err := d.memoryRuntime(sb); err != nil {
			continue
		}
		done, err := d.hibernateIfIdle(ctx, sb.ID)
		if err != nil {
			d.log.Warn("idle hibernation", "sandbox", sb.ID, "err", err)
			continue
		}
		if done {
			d.note(ctx, sb.ID, store.EventIdleHibernated, map[string]any{"idle_ms": d.cfg.IdleHibernate.Milliseconds()})
		}
	}
}

// forget drops the in-memory state of a closed sandbox.
func (d *Daemon) forget(id string) {
	a := d.act()
	a.mu.Lock()
	delete(a.last, id)
	delete(a.inFlight, id)
	a.mu.Unlock()
	d.life.remove(id)
	d.mu.Lock()
	delete(d.locks, id)
	d.mu.Unlock()
}
