package daemon

import (
	"context"
	"fmt"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/store"
)

// EnvSandboxResult is a sandbox handed over by an environment.
type EnvSandboxResult struct {
	Sandbox    *store.Sandbox
	Env        *EnvStatus
	FromPool   bool
	HandoverMS float64
	Built      bool
}

// EnvironmentSandbox hands over a sandbox of an environment: from its warm
// pool if one is ready, else forked from its snapshot, building that first
// if needed. def may be nil to use the stored definition of name. A
// snapshot older than the max age is rebuilt in the background while it
// keeps serving.
func (d *Daemon) EnvironmentSandbox(ctx context.Context, def *EnvDefinition, name string, o Overrides) (*EnvSandboxResult, error) {
	var rec *store.Environment
	var err error
	res := &EnvSandboxResult{}
	if def != nil {
		var st *EnvStatus
		if st, res.Built, err = d.BuildEnvironment(ctx, *def, false, nil); err != nil {
			return nil, err
		}
		rec, name = st.Rec, def.Name
	} else {
		if rec, err = d.store.GetEnvironment(ctx, name); err != nil {
			return nil, err
		}
		if rec.Checkpoint == "" {
			st, built, err := d.BuildEnvironment(ctx, EnvDefinitionOf(rec), false, nil)
			if err != nil {
				return nil, err
			}
			rec, res.Built = st.Rec, built
		}
	}
	if rec.Checkpoint == "" {
		return nil, fmt.Errorf("environment %s has no snapshot (%s): %w", name, rec.Error, errdefs.ErrFailedPrecondition)
	}
	edef := EnvDefinitionOf(rec)
	if edef.MaxAge > 0 && time.Since(rec.BuiltAt) > edef.MaxAge {
		d.rebuildInBackground(edef)
	}
	t := time.Now()
	noOverrides := o.CPU == "" && o.Memory == "" && o.Pids == 0 && len(o.Env) == 0 && o.Cwd == "" && o.Egress == "" && o.Name == ""
	if noOverrides {
		sb, err := d.store.TakeFromPool(ctx, name, rec.Checkpoint)
		if err != nil {
			return nil, err
		}
		if sb != nil {
			res.Sandbox, res.FromPool, res.HandoverMS = sb, true, msSince(t)
			d.envEvent(ctx, name, "env.handover", map[string]any{"sandbox": sb.ID, "pool": true, "handover_ms": res.HandoverMS})
			d.refillPool(name)
			if res.Env, err = d.envStatus(ctx, rec); err != nil {
				return nil, err
			}
			return res, nil
		}
	}
	if o.Name == "" {
		o.Name = name + "-" + randomHex(3)
	}
	if res.Sandbox, err = d.startFromEnv(ctx, rec, o, ""); err != nil {
		return nil, err
	}
	res.HandoverMS = msSince(t)
	d.envEvent(ctx, name, "env.handover", map[string]any{"sandbox": res.Sandbox.ID, "pool": false, "handover_ms": res.HandoverMS})
	d.refillPool(name)
	res.Env, err = d.envStatus(ctx, rec)
	return res, err
}

// startFromEnv starts a sandbox from an environment's snapshot.
func (d *Daemon) startFromEnv(ctx context.Context, rec *store.Environment, o Overrides, pool string) (*store.Sandbox, error) {
	ck, err := d.store.GetCheckpoint(ctx, rec.Checkpoint)
	if err != nil {
		return nil, err
	}
	return d.startFromCheckpoint(ctx, startOptions{checkpoint: ck, overrides: o, pool: pool,
		event: map[string]any{"environment": rec.Name, "checkpoint": ck.ID}})
}

// rebuildInBackground rebuilds an environment whose snapshot is too old;
// the old snapshot serves until the new one is ready. A failed rebuild is
// not retried before half the max age (at least a minute) has passed.
func (d *Daemon) rebuildInBackground(def EnvDefinition) {
	es := d.envs()
	es.mu.Lock()
	if last, ok := es.rebuilt[def.Name]; ok && time.Since(last) < max(def.MaxAge/2, time.Minute) {
		es.mu.Unlock()
		return
	}
	es.rebuilt[def.Name] = time.Now()
	es.mu.Unlock()
	go func() {
		ctx := context.Background()
		if _, _, err := d.BuildEnvironment(ctx, def, true, nil); err != nil {
			d.log.Warn("scheduled environment rebuild failed; the old snapshot keeps serving", "environment", def.Name, "err", err)
		}
	}()
}

// refillPool starts sandboxes in the background until the environment's
// pool holds its size of running sandboxes of the current snapshot; pooled
// sandboxes of an older snapshot are closed.
func (d *Daemon) refillPool(name string) {
	es := d.envs()
	es.mu.Lock()
	if es.filling[name] {
		es.mu.Unlock()
		return
	}
	es.filling[name] = true
	es.mu.Unlock()
	go func() {
		defer func() {
			es.mu.Lock()
			delete(es.filling, name)
			es.mu.Unlock()
		}()
		ctx := context.Background()
		for {
			rec, err := d.store.GetEnvironment(ctx, name)
			if err != nil || rec.Checkpoint == "" {
				return
			}
			size := EnvDefinitionOf(rec).PoolSize
			pooled, err := d.store.Pooled(ctx, name)
			if err != nil {
				return
			}
			n := 0
			for _, sb := range pooled {
				if sb.FromCheckpoint != rec.Checkpoint || n >= size {
					// Claimed first: a hand-over may have taken it meanwhile.
					if claimed, err := d.store.ClaimFromPool(ctx, sb.ID, name); err == nil && claimed {
						d.Delete(ctx, sb.ID)
					}
					continue
				}
				n++
			}
			if n >= size {
				return
			}
			if _, err := d.startFromEnv(ctx, rec, Overrides{Name: "pool-" + name + "-" + randomHex(3)}, name); err != nil {
				d.log.Warn("warm pool refill failed", "environment", name, "err", err)
				return
			}
		}
	}()
}
