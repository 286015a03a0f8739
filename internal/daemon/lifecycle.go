package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/store"
)

// transitions is the sandbox lifecycle, in one place. A state change not
// listed here is a FailedPrecondition error naming both states.
//
//	creating            → running                  (started, agent answered)
//	running             ⇄ paused                   (pause, unpause)
//	running, paused     → hibernating → hibernated (hibernate)
//	hibernated          → running                  (wake)
//	hibernating         → running, paused          (the checkpoint failed; the container runs)
//	running, paused     → degraded                 (reconcile could not confirm it healthy)
//	degraded            → running, paused          (a later reconcile could)
//	every live state    → failed, closing
//	failed ⇄ closing; failed, closing → closed
//
// degraded is entered and left only by reconcile (or left by a close): the
// sandbox is kept, never torn down on a guess.
var transitions = map[store.State][]store.State{
	store.StateCreating:    {store.StateRunning, store.StateFailed, store.StateClosing},
	store.StateRunning:     {store.StatePaused, store.StateHibernating, store.StateDegraded, store.StateFailed, store.StateClosing},
	store.StatePaused:      {store.StateRunning, store.StateHibernating, store.StateDegraded, store.StateFailed, store.StateClosing},
	store.StateHibernating: {store.StateHibernated, store.StateRunning, store.StatePaused, store.StateFailed, store.StateClosing},
	store.StateHibernated:  {store.StateRunning, store.StateFailed, store.StateClosing},
	store.StateDegraded:    {store.StateRunning, store.StatePaused, store.StateFailed, store.StateClosing},
	store.StateFailed:      {store.StateClosing, store.StateClosed},
	store.StateClosing:     {store.StateClosed, store.StateFailed},
	store.StateClosed:      {},
}

// checkTransition returns nil if a sandbox may go from one state to another.
func checkTransition(id string, from, to store.State) error {
	if slices.Contains(transitions[from], to) {
		return nil
	}
	return fmt.Errorf("sandbox %s is %s, cannot become %s: %w", id, from, to, errdefs.ErrFailedPrecondition)
}

// setState is the only way a sandbox's state changes: the move from
// sb.State must be in the transitions table, and the store records it only
// if the sandbox is still in sb.State (compare-and-set), so a concurrent
// change is an error rather than overwritten. reason is recorded as the
// sandbox's error text ("" clears it). On success sb is updated.
func (d *Daemon) setState(ctx context.Context, sb *store.Sandbox, to store.State, reason string) error {
	return d.setStateNoting(ctx, sb, to, reason, "", nil)
}

// setStateNoting is setState that records event typ (with data) in the
// same write: a reader never sees the new state before its event.
func (d *Daemon) setStateNoting(ctx context.Context, sb *store.Sandbox, to store.State, reason, typ string, data map[string]any) error {
	if err := checkTransition(sb.ID, sb.State, to); err != nil {
		return err
	}
	if err := d.store.SwapSandboxStateNoting(ctx, sb.ID, sb.State, to, reason, typ, data); err != nil {
		return err
	}
	sb.State, sb.Error = to, reason
	return nil
}

// recordState is setState where the caller cannot do anything about a
// failure (a cleanup path that already returns another error): it is logged.
func (d *Daemon) recordState(ctx context.Context, sb *store.Sandbox, to store.State, reason string) {
	d.bestEffort(ctx, "record state "+string(to), d.setState(ctx, sb, to, reason), slog.String("sandbox", sb.ID))
}

// requireState answers a caller whose action needs the sandbox in one of
// the allowed states: anything else is a FailedPrecondition error naming the
// action, the state and what would do.
func requireState(sb *store.Sandbox, action string, allowed ...store.State) error {
	if slices.Contains(allowed, sb.State) {
		return nil
	}
	names := make([]string, len(allowed))
	for i, s := range allowed {
		names[i] = string(s)
	}
	return fmt.Errorf("cannot %s sandbox %s: it is %s (want %s): %w", action, sb.ID, sb.State, strings.Join(names, " or "), errdefs.ErrFailedPrecondition)
}
