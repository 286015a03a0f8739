package env

import (
	"context"
	"fmt"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/store"
)

// SandboxResult is a sandbox handed over by an environment.
type SandboxResult struct {
	Sandbox    *store.Sandbox
	Env        *Status
	FromPool   bool
	HandoverMS float64
	Built      bool
}

// Sandbox hands over a sandbox of an environment: from its warm pool if one
// is ready, else started from its snapshot, building that first if needed.
// def may be nil to use the stored definition of name. A snapshot older
// than the max age is rebuilt in the background while it keeps serving.
func (m *Manager) Sandbox(ctx context.Context, def *Definition, name string, o Overrides) (*SandboxResult, error) {
	return m.sandbox(ctx, def, name, o, true)
}

// SandboxBuilt is Sandbox by name that never builds: an environment
// without a snapshot is a FailedPrecondition (an unknown one NotFound).
func (m *Manager) SandboxBuilt(ctx context.Context, name string, o Overrides) (*SandboxResult, error) {
	return m.sandbox(ctx, nil, name, o, false)
}

func (m *Manager) sandbox(ctx context.Context, def *Definition, name string, o Overrides, build bool) (*SandboxResult, error) {
	var rec *store.Environment
	var err error
	res := &SandboxResult{}
	if def != nil {
		var st *Status
		if st, res.Built, err = m.Build(ctx, *def, false, nil); err != nil {
			return nil, err
		}
		rec, name = st.Rec, def.Name
	} else {
		if rec, err = m.store.GetEnvironment(ctx, name); err != nil {
			return nil, err
		}
		if rec.Checkpoint == "" && !build {
			why := "it is not built"
			if rec.Error != "" {
				why = "its last build failed: " + rec.Error
			}
			return nil, fmt.Errorf("environment %s has no snapshot (%s); build it with `forkbox env build`: %w", name, why, errdefs.ErrFailedPrecondition)
		}
		if rec.Checkpoint == "" {
			st, built, err := m.Build(ctx, DefinitionOf(rec), false, nil)
			if err != nil {
				return nil, err
			}
			rec, res.Built = st.Rec, built
		}
	}
	if rec.Checkpoint == "" {
		return nil, fmt.Errorf("environment %s has no snapshot (%s): %w", name, rec.Error, errdefs.ErrFailedPrecondition)
	}
	// A snapshot this call built is fresh, however long the call took.
	edef := DefinitionOf(rec)
	if !res.Built && edef.MaxAge > 0 && time.Since(rec.BuiltAt) > edef.MaxAge {
		m.rebuildInBackground(edef)
	}
	t := time.Now()
	if o.empty() {
		sb, err := m.store.TakeFromPool(ctx, name, rec.Checkpoint)
		if err != nil {
			return nil, err
		}
		if sb != nil {
			res.Sandbox, res.FromPool, res.HandoverMS = sb, true, msSince(t)
			m.event(ctx, name, "env.handover", map[string]any{"sandbox": sb.ID, "pool": true, "handover_ms": res.HandoverMS})
			m.refillPool(name)
			// The sandbox is out of the pool: a caller gone by now must not
			// turn the hand-over into an error that leaves it to nobody.
			if res.Env, err = m.status(context.WithoutCancel(ctx), rec); err != nil {
				return nil, err
			}
			return res, nil
		}
	}
	if o.Name == "" {
		o.Name = name + "-" + randomHex(3)
	}
	if res.Sandbox, err = m.startFrom(ctx, rec, o, ""); err != nil {
		return nil, err
	}
	res.HandoverMS = msSince(t)
	m.event(ctx, name, "env.handover", map[string]any{"sandbox": res.Sandbox.ID, "pool": false, "handover_ms": res.HandoverMS})
	m.refillPool(name)
	res.Env, err = m.status(ctx, rec)
	return res, err
}

// startFrom starts a sandbox from an environment's snapshot.
func (m *Manager) startFrom(ctx context.Context, rec *store.Environment, o Overrides, pool string) (*store.Sandbox, error) {
	return m.sb.StartFromCheckpoint(ctx, rec.Checkpoint, o, pool, map[string]any{"environment": rec.Name, "checkpoint": rec.Checkpoint})
}

// rebuildInBackground rebuilds an environment whose snapshot is too old;
// the old snapshot serves until the new one is ready. A failed rebuild is
// not retried before half the max age (at least a minute) has passed.
func (m *Manager) rebuildInBackground(def Definition) {
	m.mu.Lock()
	if last, ok := m.rebuilt[def.Name]; ok && time.Since(last) < max(def.MaxAge/2, time.Minute) {
		m.mu.Unlock()
		return
	}
	m.rebuilt[def.Name] = time.Now()
	m.mu.Unlock()
	m.spawn(func(ctx context.Context) {
		if _, _, err := m.Build(ctx, def, true, nil); err != nil && ctx.Err() == nil {
			m.log.Warn("scheduled environment rebuild failed; the old snapshot keeps serving", "environment", def.Name, "err", err)
		}
	})
}

// refillPool starts sandboxes in the background until the environment's
// pool holds its size of running sandboxes of the current snapshot; pooled
// sandboxes of an older snapshot are closed. One refill per environment
// runs at a time; Delete waits for it.
func (m *Manager) refillPool(name string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed || m.filling[name] != nil {
		return
	}
	done := make(chan struct{})
	m.filling[name] = done
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		defer func() {
			m.mu.Lock()
			delete(m.filling, name)
			m.mu.Unlock()
			close(done)
		}()
		m.fill(m.ctx, name)
	}()
}

func (m *Manager) fill(ctx context.Context, name string) {
	for ctx.Err() == nil {
		rec, err := m.store.GetEnvironment(ctx, name)
		if err != nil || rec.Checkpoint == "" {
			return
		}
		size := DefinitionOf(rec).PoolSize
		pooled, err := m.store.Pooled(ctx, name)
		if err != nil {
			return
		}
		n := 0
		for _, sb := range pooled {
			if sb.FromCheckpoint != rec.Checkpoint || n >= size {
				// Claimed first: a hand-over may have taken it meanwhile.
				if claimed, err := m.store.ClaimFromPool(ctx, sb.ID, name); err == nil && claimed {
					m.sb.Delete(ctx, sb.ID)
				}
				continue
			}
			n++
		}
		if n >= size {
			return
		}
		if _, err := m.startFrom(ctx, rec, Overrides{Name: "pool-" + name + "-" + randomHex(3)}, name); err != nil {
			if ctx.Err() == nil {
				m.log.Warn("warm pool refill failed", "environment", name, "err", err)
			}
			return
		}
	}
}
