package daemon

import (
	"context"
	"errors"
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
