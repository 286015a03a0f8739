package transfer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/forkbox/forkbox/errdefs"
)

// errStalled marks the cause of a transfer given up because its sender
// sent nothing for Limits.Idle.
var errStalled = errors.New("the sender stalled")

// withStall derives a context that ends, with a cause saying so (stalled),
// when a read of a reader that watch wraps waits for the sender longer
// than idle. Only the time spent waiting in Read counts: a receiver slow
// to take the bytes (btrfs receive on a busy disk) is not the sender's
// stall.
func withStall(ctx context.Context, idle time.Duration) (_ context.Context, watch func(io.Reader) io.Reader, stop context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(ctx)
	cause := fmt.Errorf("the sender sent nothing for %v: %w: %w", idle, errStalled, errdefs.ErrDeadlineExceeded)
	stall := func() { cancel(cause) }
	return ctx, func(r io.Reader) io.Reader { return &idleReader{r: r, idle: idle, stall: stall} }, func() { cancel(nil) }
}

// idleReader reads r and calls stall when one Read waits longer than idle.
type idleReader struct {
	r     io.Reader
	idle  time.Duration
	stall func()
}

func (i *idleReader) Read(p []byte) (int, error) {
	t := time.AfterFunc(i.idle, i.stall)
	n, err := i.r.Read(p)
	t.Stop()
	return n, err
}

// stalled is the error of a transfer whose sender stalled, or nil.
func stalled(ctx context.Context) error {
	if c := context.Cause(ctx); errors.Is(c, errStalled) {
		return c
	}
	return nil
}
