package daemon

import (
	"context"
	"errors"
	"log/slog"
)

// undoStack is a last-in-first-out list of undo steps for multi-step setup:
// push an undo after each step succeeds; on failure, run them in reverse.
type undoStack struct {
	steps []func(context.Context) error
}

func (u *undoStack) push(f func(context.Context) error) { u.steps = append(u.steps, f) }

// run undoes every step, newest first, and joins their errors.
func (u *undoStack) run(ctx context.Context) error {
	var errs []error
	for i := len(u.steps) - 1; i >= 0; i-- {
		if err := u.steps[i](ctx); err != nil {
			errs = append(errs, err)
		}
	}
	u.steps = nil
	return errors.Join(errs...)
}

// release forgets the undo steps: the setup succeeded.
func (u *undoStack) release() { u.steps = nil }

// bestEffort logs the failure of a step whose error the caller cannot act
// on (a ledger note, a cleanup on a path that already fails): never dropped
// silently, never failing the operation. A nil err does nothing.
func (d *Daemon) bestEffort(ctx context.Context, what string, err error, attrs ...slog.Attr) {
	if err == nil {
		return
	}
	attrs = append(attrs, slog.String("err", err.Error()))
	d.log.LogAttrs(ctx, slog.LevelWarn, what+" failed", attrs...)
}

// note appends a ledger event that does not decide the operation's outcome
// (ready, found, fork notified...); a failure to record it is logged.
func (d *Daemon) note(ctx context.Context, sandboxID, typ string, data map[string]any) {
	_, err := d.store.AppendEvent(ctx, sandboxID, typ, data)
	d.bestEffort(ctx, "ledger "+typ, err, slog.String("sandbox", sandboxID))
}
