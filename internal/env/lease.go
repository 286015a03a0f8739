package env

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/store"
)

// A lease lets a client run an environment's setup itself (the TypeScript
// SDK's setup function): BeginBuild gives it a builder sandbox, and
// CompleteBuild checkpoints that sandbox as the environment's snapshot.
// The lease holds the hash's place in m.builds, so other callers of the
// hash wait for it as for a build. A goroutine of the manager owns each
// lease: it ends it when CompleteBuild does, when the lease times out, or
// at Close (then the builder is closed).
type lease struct {
	id      string
	def     Definition
	hash    string
	builder *store.Sandbox
	start   time.Time
	// state is guarded by m.mu: leaseStarting until BeginBuild has a
	// builder, leaseHeld while the client holds it, leaseDone once someone
	// ended it.
	state  int
	result chan error // CompleteBuild's outcome (buffered)
}

const (
	leaseStarting = iota
	leaseHeld
	leaseDone
)

// BeginBuild returns the environment if its hash is built (waiting for a
// build in flight), or a builder sandbox and a lease for the caller to run
// the setup in.
func (m *Manager) BeginBuild(ctx context.Context, def Definition) (*Status, *store.Sandbox, string, error) {
	for {
		rec, err := m.define(ctx, &def)
		if err != nil {
			return nil, nil, "", err
		}
		if rec.State == store.EnvReady && rec.Checkpoint != "" {
			st, err := m.status(ctx, rec)
			return st, nil, "", err
		}
		mine := make(chan *lease, 1)
		ch := m.builds.DoChan(rec.Hash, func() (any, error) { return nil, m.holdLease(ctx, def, rec.Hash, mine) })
		select {
		case l := <-mine:
			builder, id, err := m.startLease(ctx, l)
			if err != nil {
				return nil, nil, "", err
			}
			return nil, builder, id, nil
		case r := <-ch:
			// Built or failed: look again (a failed client setup is ours
			// to retry).
			if r.Err != nil {
				return nil, nil, "", r.Err
			}
		case <-ctx.Done():
			return nil, nil, "", ctx.Err()
		}
	}
}

// holdLease is the lease's place in m.builds: it hands the lease to its
// caller on mine and returns when the lease ends, with the error waiters
// get. A caller (ctx) that goes away before it has a builder ends it.
func (m *Manager) holdLease(ctx context.Context, def Definition, hash string, mine chan<- *lease) error {
	if !m.enter() {
		return errClosed
	}
	defer m.wg.Done()
	if m.built(m.ctx, def.Name, hash) {
		// A build or lease that ended a moment ago made it (its flight
		// was over when this one began): no lease, the caller looks again.
		return nil
	}
	m.setBuilding(hash, true)
	defer m.setBuilding(hash, false)
	l := &lease{def: def, hash: hash, start: time.Now(), result: make(chan error, 1)}
	mine <- l
	timer := time.NewTimer(leaseTimeout)
	defer timer.Stop()
	callerGone := ctx.Done()
	reason := ""
	for reason == "" {
		select {
		case err := <-l.result:
			return waitersErr(err)
		case <-callerGone:
			callerGone = nil // once the client holds the lease, its request may end
			m.mu.Lock()
			starting := l.state == leaseStarting
			if starting {
				l.state = leaseDone
			}
			m.mu.Unlock()
			if starting {
				return nil
			}
		case <-timer.C:
			reason = "the lease timed out"
		case <-m.ctx.Done():
			reason = "the daemon is shutting down"
		}
	}
	m.mu.Lock()
	state := l.state
	l.state = leaseDone
	if state == leaseHeld {
		delete(m.leases, l.id)
	}
	m.mu.Unlock()
	switch state {
	case leaseStarting:
		// BeginBuild is still starting the builder: it sees the lease ended
		// and closes the builder itself.
		return nil
	case leaseDone:
		// CompleteBuild took it first and is finishing it.
		return waitersErr(<-l.result)
	}
	ctx = context.WithoutCancel(m.ctx)
	if err := m.sb.Delete(ctx, l.builder.ID); err != nil && !errdefs.IsNotFound(err) {
		m.log.Warn("close the builder of an expired build lease", "sandbox", l.builder.ID, "err", err)
	}
	m.event(ctx, def.Name, "env.build_failed", map[string]any{"hash": hash, "lease": l.id, "error": reason})
	return nil
}

// waitersErr is what callers waiting for a lease get from its outcome: a
// failed client setup, or a client that went away, is not an error for
// them (they may build).
func waitersErr(err error) error {
	if errors.Is(err, errdefs.ErrFailedPrecondition) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return nil
	}
	return err
}

// startLease starts the builder of a lease this caller holds and registers
// the lease.
func (m *Manager) startLease(ctx context.Context, l *lease) (*store.Sandbox, string, error) {
	builder, err := m.sb.StartBuilder(ctx, l.def, l.hash, "")
	m.mu.Lock()
	ended := l.state == leaseDone
	if err == nil && !ended {
		l.id, l.builder, l.state = "ls-"+randomHex(6), builder, leaseHeld
		m.leases[l.id] = l
	} else {
		l.state = leaseDone
	}
	m.mu.Unlock()
	switch {
	case err != nil:
		l.result <- err
		return nil, "", err
	case ended:
		m.sb.Delete(context.WithoutCancel(ctx), builder.ID)
		if ctx.Err() != nil {
			return nil, "", ctx.Err()
		}
		return nil, "", errClosed
	}
	m.event(ctx, l.def.Name, "env.build_started", map[string]any{"hash": l.hash, "lease": l.id, "builder": builder.ID})
	return builder, l.id, nil
}

// CompleteBuild ends a lease: with ok, the builder is checkpointed as the
// environment's snapshot (after its start command, if the definition has
// one); either way the builder is closed and waiters are
// released.
func (m *Manager) CompleteBuild(ctx context.Context, id string, ok bool, reason string) (*Status, error) {
	m.mu.Lock()
	l, found := m.leases[id]
	if found {
		delete(m.leases, id)
		l.state = leaseDone
	}
	m.mu.Unlock()
	if !found {
		return nil, fmt.Errorf("build lease %q: %w", id, errdefs.ErrNotFound)
	}
	defer m.sb.Delete(context.WithoutCancel(ctx), l.builder.ID)
	if !ok {
		err := fmt.Errorf("the client's setup failed: %s: %w", reason, errdefs.ErrFailedPrecondition)
		l.result <- err
		m.event(ctx, l.def.Name, "env.build_failed", map[string]any{"hash": l.hash, "error": reason})
		return nil, err
	}
	ck, err := m.capture(ctx, l.def, l.builder.ID, func(Progress) {})
	if err == nil {
		err = m.store.PutEnvSnapshot(ctx, l.hash, l.def.Name, ck, len(l.def.Steps))
	}
	if err == nil {
		err = m.finishBuild(ctx, l.def, l.hash, ck, 0, l.start, func(Progress) {})
	}
	l.result <- err
	if err != nil {
		return nil, err
	}
	return m.Get(ctx, l.def.Name)
}
