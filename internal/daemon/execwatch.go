package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"sync"
	"time"

	"github.com/forkbox/forkbox/errdefs"
)

// execTimeoutGrace is how long past an exec's own timeout the daemon waits
// for the agent to report its end (the kill, its grace, the output's end):
// the timeout is kept in the sandbox, and an agent that ignores it must not
// hold the call, and its sandbox's slot, for longer.
var execTimeoutGrace = 30 * time.Second

// errExecOverdue is the cause of an exec's context ended by its watch.
var errExecOverdue = errors.New("the agent did not report the command's end within its timeout and grace")

// execWatch ends an exec with a timeout once the agent has kept it for
// the timeout and execTimeoutGrace. The time the output spends blocked on
// its caller (a slow reader of the stream) is not counted: the agent is
// held back by the caller then, not late.
type execWatch struct {
	ctx    context.Context
	cancel context.CancelCauseFunc
	mu     sync.Mutex
	t      *time.Timer   // nil: no timeout
	left   time.Duration // of the budget, when the timer last started
	since  time.Time     // when it last started
}

// watchExec watches an exec of timeout (none when not positive, or so
// large that no deadline follows). Call done with the call's error.
func watchExec(ctx context.Context, timeout time.Duration) *execWatch {
	w := &execWatch{ctx: ctx}
	if timeout <= 0 || timeout > math.MaxInt64-execTimeoutGrace {
		return w
	}
	w.ctx, w.cancel = context.WithCancelCause(ctx)
	w.left, w.since = timeout+execTimeoutGrace, time.Now()
	w.t = time.AfterFunc(w.left, func() { w.cancel(errExecOverdue) })
	return w
}

// writer returns out with its writes' time left out of the watch.
func (w *execWatch) writer(out io.Writer) io.Writer {
	if w.t == nil || out == nil {
		return out
	}
	return writerFunc(func(p []byte) (int, error) {
		w.mu.Lock()
		running := w.t.Stop() // false: it fired, the call is ending
		if running {
			w.left -= time.Since(w.since)
		}
		w.mu.Unlock()
		defer func() {
			if !running {
				return
			}
			w.mu.Lock()
			w.since = time.Now()
			w.t.Reset(max(w.left, 0))
			w.mu.Unlock()
		}()
		return out.Write(p)
	})
}

// done stops the watch and returns err, DeadlineExceeded when the watch
// ended the call.
func (w *execWatch) done(err error) error {
	if w.t == nil {
		return err
	}
	w.mu.Lock()
	w.t.Stop()
	w.mu.Unlock()
	overdue := errors.Is(context.Cause(w.ctx), errExecOverdue)
	w.cancel(nil)
	if err != nil && overdue {
		return fmt.Errorf("exec: %v (%v): %w", errExecOverdue, err, errdefs.ErrDeadlineExceeded)
	}
	return err
}

type writerFunc func(p []byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
