package network

import (
	"errors"
)

// cleanup is a last-in-first-out stack of undo steps for multi-step setup.
type cleanup struct {
	steps []func() error
}

// add registers an undo step, to run before every step added earlier.
func (c *cleanup) add(f func() error) { c.steps = append(c.steps, f) }

// run runs the undo steps in reverse order and joins their errors.
func (c *cleanup) run() error {
	var errs []error
	for i := len(c.steps) - 1; i >= 0; i-- {
		if err := c.steps[i](); err != nil {
			errs = append(errs, err)
		}
	}
	c.steps = nil
	return errors.Join(errs...)
}

// release forgets every undo step: setup succeeded.
func (c *cleanup) release() { c.steps = nil }

func joinErrs(errs ...error) error { return errors.Join(errs...) }
