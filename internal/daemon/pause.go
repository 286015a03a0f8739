package daemon

import (
	"context"

	"github.com/forkbox/forkbox/internal/store"
)

// live returns a sandbox that is running, paused or hibernated.
func (d *Daemon) live(ctx context.Context, id string) (*store.Sandbox, error) {
	sb, err := d.store.GetSandbox(ctx, id)
	if err != nil {
		return nil, err
	}
	if err := requireState(sb, "use", store.StateRunning, store.StatePaused, store.StateHibernated); err != nil {
		return nil, err
	}
	return sb, nil
}

// Pause stops a running sandbox in place (suspend): its processes stop and
// keep their memory.
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
	from, to, ev := sb.State, store.StateRunning, store.EventUnpaused
	if pause {
		to, ev = store.StatePaused, store.EventPaused
	}
	// Recorded first: a crash between the two is reconciled from the
	// actual state (runtime or freezer, see isSuspended) on the next start.
	if err := d.setState(ctx, sb, to, ""); err != nil {
		return nil, err
	}
	if pause {
		err = d.suspend(ctx, sb)
	} else {
		err = d.unsuspend(ctx, sb)
	}
	if err != nil {
		d.recordState(context.WithoutCancel(ctx), sb, from, "")
		return nil, err
	}
	d.note(ctx, sb.ID, ev, nil)
	return sb, nil
}
