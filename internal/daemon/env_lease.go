package daemon

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
// Other callers of the same hash wait for the lease, as for a build.
type lease struct {
	def     EnvDefinition
	hash    string
	builder *store.Sandbox
	call    *buildCall
	start   time.Time
}

// leaseTimeout bounds how long a client may hold a build.
const leaseTimeout = 2 * time.Hour

// BeginBuild returns the environment if its hash is built (waiting for a
// build in flight), or a builder sandbox and a lease for the caller to run
// the setup in.
func (d *Daemon) BeginBuild(ctx context.Context, def EnvDefinition) (*EnvStatus, *store.Sandbox, string, error) {
	for {
		rec, err := d.defineEnv(ctx, &def)
		if err != nil {
			return nil, nil, "", err
		}
		if rec.State == store.EnvReady && rec.Checkpoint != "" {
			st, err := d.envStatus(ctx, rec)
			return st, nil, "", err
		}
		es := d.envs()
		es.mu.Lock()
		if c, ok := es.builds[rec.Hash]; ok {
			es.mu.Unlock()
			select {
			case <-c.done: // built or failed: look again (a failed one is ours to retry)
				if c.err != nil {
					return nil, nil, "", c.err
				}
				continue
			case <-ctx.Done():
				return nil, nil, "", ctx.Err()
			}
		}
		c := &buildCall{done: make(chan struct{})}
		es.builds[rec.Hash] = c
		es.mu.Unlock()
		builder, err := d.startBuilder(ctx, def, rec.Hash)
		if err != nil {
			d.endLease(&lease{hash: rec.Hash, call: c}, err)
			return nil, nil, "", err
		}
		id := newID("ls-")
		l := &lease{def: def, hash: rec.Hash, builder: builder, call: c, start: time.Now()}
		es.mu.Lock()
		es.leases[id] = l
		es.mu.Unlock()
		time.AfterFunc(leaseTimeout, func() {
			d.CompleteBuild(context.Background(), id, false, "the lease timed out")
		})
		d.envEvent(ctx, def.Name, "env.build_started", map[string]any{"hash": rec.Hash, "lease": id, "builder": builder.ID})
		return nil, builder, id, nil
	}
}

func (d *Daemon) startBuilder(ctx context.Context, def EnvDefinition, hash string) (*store.Sandbox, error) {
	cfg, img, err := d.validate(ctx, &CreateOptions{Image: def.Image, CPU: def.CPU, Memory: def.Memory, Pids: def.Pids,
		Env: def.Env, Cwd: def.Cwd, Egress: def.Egress, Runtime: def.Runtime})
	if err != nil {
		return nil, err
	}
	return d.launch(ctx, launchSpec{name: "build-" + def.Name + "-" + randomHex(3), runtime: def.Runtime, cfg: *cfg, img: img,
		event: map[string]any{"environment": def.Name, "hash": hash}})
}

// CompleteBuild ends a lease: with ok, the builder is checkpointed as the
// environment's snapshot; either way the builder is closed and waiters are
// released.
func (d *Daemon) CompleteBuild(ctx context.Context, id string, ok bool, reason string) (*EnvStatus, error) {
	es := d.envs()
	es.mu.Lock()
	l, found := es.leases[id]
	delete(es.leases, id)
	es.mu.Unlock()
	if !found {
		return nil, fmt.Errorf("build lease %q: %w", id, errdefs.ErrNotFound)
	}
	defer d.Delete(context.WithoutCancel(ctx), l.builder.ID)
	if !ok {
		err := fmt.Errorf("the client's setup failed: %s: %w", reason, errdefs.ErrFailedPrecondition)
		d.endLease(l, err)
		d.envEvent(ctx, l.def.Name, "env.build_failed", map[string]any{"hash": l.hash, "error": reason})
		return nil, err
	}
	ck, err := d.Checkpoint(ctx, l.builder.ID, "env:"+l.def.Name)
	if err == nil {
		err = d.store.PutEnvSnapshot(ctx, l.hash, l.def.Name, ck.ID, len(l.def.Steps))
	}
	if err == nil {
		err = d.finishBuild(ctx, l.def, l.hash, ck.ID, 0, l.start, func(EnvProgress) {})
	}
	d.endLease(l, err)
	if err != nil {
		return nil, err
	}
	return d.GetEnvironment(ctx, l.def.Name)
}

func (d *Daemon) endLease(l *lease, err error) {
	es := d.envs()
	es.mu.Lock()
	if es.builds[l.hash] == l.call {
		delete(es.builds, l.hash)
	}
	es.mu.Unlock()
	l.call.err = err
	if errors.Is(err, errdefs.ErrFailedPrecondition) {
		// A failed client setup is not an error for waiters: they may build.
		l.call.err = nil
	}
	close(l.call.done)
}
