package daemon

import (
	"context"
	"time"

	"github.com/forkbox/forkbox/internal/store"
)

// Checkpoints outlive their sandbox until deleted. With a retention set,
// the checkpoints of closed sandboxes are deleted once older than it;
// environment snapshots are the environment's to delete, never the
// janitor's.

// startJanitor deletes expired checkpoints until ctx ends.
func (d *Daemon) startJanitor(ctx context.Context) {
	if d.cfg.CheckpointRetention <= 0 {
		return
	}
	every := min(d.cfg.CheckpointRetention/2, time.Minute)
	d.bg.Add(1)
	go func() {
		defer d.bg.Done()
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if n, err := d.expireCheckpoints(ctx); err != nil {
					d.log.Warn("checkpoint retention", "err", err)
				} else if n > 0 {
					d.log.Info("checkpoint retention: deleted expired checkpoints", "count", n)
				}
			}
		}
	}()
}

// expireCheckpoints deletes the checkpoints of closed sandboxes that are
// older than the retention, and returns how many it deleted.
func (d *Daemon) expireCheckpoints(ctx context.Context) (int, error) {
	cks, err := d.store.ListCheckpoints(ctx, "")
	if err != nil {
		return 0, err
	}
	n := 0
	for _, ck := range cks {
		if time.Since(ck.CreatedAt) < d.cfg.CheckpointRetention {
			continue
		}
		if env, err := d.store.IsEnvSnapshot(ctx, ck.ID); err != nil || env {
			continue
		}
		sb, err := d.store.GetSandbox(ctx, ck.SandboxID)
		if err != nil || sb.State != store.StateClosed {
			continue
		}
		if err := d.deleteCheckpoint(ctx, ck.ID); err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}
