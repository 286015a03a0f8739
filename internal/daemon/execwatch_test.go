package daemon

import (
	"context"
	"errors"
	"io"
	"math"
	"testing"
	"time"

	"github.com/forkbox/forkbox/errdefs"
)

// An exec with no timeout, or one so large that a deadline would overflow
// (the SDKs send math.MaxInt64 for "none"), is not watched.
func TestExecWatchNoDeadline(t *testing.T) {
	for _, d := range []time.Duration{0, -1, time.Duration(math.MaxInt64), time.Duration(math.MaxInt64/time.Millisecond) * time.Millisecond} {
		w := watchExec(context.Background(), d)
		if w.ctx.Err() != nil {
			t.Errorf("timeout %d: the exec's context ended at once", d)
		}
		if _, ok := w.ctx.Deadline(); ok || w.t != nil {
			t.Errorf("timeout %d: watched", d)
		}
		if err := w.done(nil); err != nil {
			t.Errorf("timeout %d: done: %v", d, err)
		}
	}
}

// Time the output spends blocked on a slow caller is not counted.
func TestExecWatchSlowCaller(t *testing.T) {
	defer func(d time.Duration) { execTimeoutGrace = d }(execTimeoutGrace)
	execTimeoutGrace = 0
	w := watchExec(context.Background(), 2*time.Second)
	defer w.done(nil)
	slow := w.writer(writerFunc(func(p []byte) (int, error) {
		time.Sleep(3 * time.Second) // the caller reading slowly: the scenario, not a wait for something
		return len(p), nil
	}))
	slow.Write([]byte("out"))
	if err := w.ctx.Err(); err != nil {
		t.Fatalf("3 s blocked on the caller ended a 2 s budget: %v", err)
	}
}

// Output does not renew the budget: an agent that keeps writing, past its
// timeout and grace, is ended, and the call's error is DeadlineExceeded.
func TestExecWatchOverdue(t *testing.T) {
	defer func(d time.Duration) { execTimeoutGrace = d }(execTimeoutGrace)
	execTimeoutGrace = 100 * time.Millisecond
	w := watchExec(context.Background(), 200*time.Millisecond)
	out := w.writer(io.Discard)
	guard := time.After(time.Minute) // the hang this test is about
	for w.ctx.Err() == nil {
		select {
		case <-guard:
			t.Fatal("an agent writing every 20 ms kept the exec past its budget for a minute")
		case <-time.After(20 * time.Millisecond): // the agent's pace
		}
		out.Write([]byte("tick"))
	}
	if err := w.done(errors.New("agent exec: context canceled")); !errdefs.IsDeadlineExceeded(err) {
		t.Errorf("overdue exec: %v, want DeadlineExceeded", err)
	}
}
