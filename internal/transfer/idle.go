package transfer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/forkbox/forkbox/errdefs"
)

// errStalled is the cause of a transfer given up because its sender sent
// nothing for Limits.Idle.
var errStalled = errors.New("the sender sent nothing for too long")

// withStall derives a context that ends, with errStalled as its cause,
// when a read of a reader that watch wraps waits for the sender longer
// than idle. Only the time spent waiting in Read counts: a receiver slow
// to take the bytes (btrfs receive on a busy disk) is not the sender's
// stall.
func withStall(ctx context.Context, idle time.Duration) (_ context.Context, watch func(io.Reader) io.Reader, stop context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(ctx)
	stall := func() { cancel(errStalled) }
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
func stalled(ctx context.Context, idle time.Duration) error {
	if errors.Is(context.Cause(ctx), errStalled) {
		return fmt.Errorf("the sender sent nothing for %v: %w", idle, errdefs.ErrDeadlineExceeded)
	}
	return nil
}
