package daemon

import (
	"context"
	"fmt"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/cgroups"
	"github.com/forkbox/forkbox/internal/store"
)

// live returns a sandbox that is running, paused or hibernated.
func (d *Daemon) live(ctx context.Context, id string) (*store.Sandbox, error) {
	sb, err := d.store.GetSandbox(ctx, id)
	if err != nil {
		return nil, err
	}
	if sb.State != store.StateRunning && sb.State != store.StatePaused && sb.State != store.StateHibernated {
		return nil, fmt.Errorf("sandbox %s is %s: %w", sb.ID, sb.State, errdefs.ErrFailedPrecondition)
	}
	return sb, nil
}

// Pause freezes a running sandbox in place with the cgroup freezer: its
// processes stop and keep their memory.
func (d *Daemon) Pause(ctx context.Context, idOrName string) (*store.Sandbox, error) {
	return d.setPaused(ctx, idOrName, true)
}

// Unpause thaws a paused sandbox.
func (d *Daemon) Unpause(ctx context.Context, idOrName string) (*store.Sandbox, error) {
	return d.setPaused(ctx, idOrName, false)
}

func (d *Daemon) setPaused(ctx context.Context, idOrName string, pause bool) (*store.Sandbox, error) {
	sb, unlock, err := d.locked(ctx, idOrName)
	if err != nil {
		return nil, err
	}
	defer unlock()
	to, ev := store.StateRunning, store.EventUnpaused
	if pause {
		to, ev = store.StatePaused, store.EventPaused
	}
	if err := checkTransition(sb.ID, sb.State, to); err != nil {
		return nil, err
	}
	// Recorded first: a crash between the two is reconciled from the
	// freezer's actual state on the next start.
	if err := d.store.SetSandboxState(ctx, sb.ID, to, ""); err != nil {
		return nil, err
	}
	if pause {
		err = cgroups.Freeze(ctx, d.cgroupPath(sb.ID))
	} else {
		err = cgroups.Thaw(ctx, d.cgroupPath(sb.ID))
	}
	if err != nil {
		d.store.SetSandboxState(context.WithoutCancel(ctx), sb.ID, sb.State, "")
		return nil, err
	}
	d.store.AppendEvent(ctx, sb.ID, ev, nil)
	sb.State = to
	return sb, nil
}
