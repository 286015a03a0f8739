package server

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/forkbox/forkbox/errdefs"
)

// The output of an ExecPty stream goes through ptyOutput: a bounded queue
// between the agent's connection (read at the terminal's pace) and the
// caller's stream (sent at the caller's pace, which HTTP/2 flow control
// lets a caller that stops reading bring to zero). A caller that takes none
// of it for the stall timeout ends the session with ResourceExhausted, and
// its stream is torn down so that the blocked send returns.

// ptyOutQueue bounds the chunks queued for one caller (each at most the
// agent's 32 KiB chunk).
const ptyOutQueue = 32

// ptyOutput owns the goroutine that sends queued output with send.
type ptyOutput struct {
	q     chan []byte
	stall time.Duration
	ended chan struct{} // closed when the sender returned
	err   error         // why, once ended is closed
	once  sync.Once
}

// newPtyOutput starts the sender; close (or a failed send) ends it.
func newPtyOutput(stall time.Duration, send func([]byte) error) *ptyOutput {
	o := &ptyOutput{q: make(chan []byte, ptyOutQueue), stall: stall, ended: make(chan struct{})}
	go func() {
		defer close(o.ended)
		for b := range o.q {
			if err := send(b); err != nil {
				o.err = err
				return
			}
		}
	}()
	return o
}

// push queues b. It fails if the sender failed, or if the queue stayed full
// for the stall timeout: the caller took none of the output for that long.
func (o *ptyOutput) push(b []byte) error {
	select {
	case o.q <- b:
		return nil
	case <-o.ended:
		return o.err
	default:
	}
	t := time.NewTimer(o.stall)
	defer t.Stop()
	select {
	case o.q <- b:
		return nil
	case <-o.ended:
		return o.err
	case <-t.C:
		return fmt.Errorf("exec pty: the caller took none of the terminal's output for %v: %w", o.stall, errdefs.ErrResourceExhausted)
	}
}

// close ends the queue and waits for the sender to send what is queued;
// flush bounds that wait, then abort tears the stream down (so that a
// blocked send returns) and the sender is joined.
func (o *ptyOutput) close(flush time.Duration, abort func()) error {
	o.once.Do(func() { close(o.q) })
	t := time.NewTimer(flush)
	defer t.Stop()
	select {
	case <-o.ended:
	case <-t.C:
		abort()
		<-o.ended
	}
	return o.err
}

// streamCtlKey is the context key of an ExecPty request's
// http.ResponseController.
type streamCtlKey struct{}

// withStreamControl gives the handler of procedure a way to end its stream
// from its side: a past read deadline ends a blocked Receive, a past write
// deadline resets the stream (HTTP/2) or its connection (HTTP/1.1) so a
// blocked Send returns.
func withStreamControl(procedure string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == procedure {
			r = r.WithContext(context.WithValue(r.Context(), streamCtlKey{}, http.NewResponseController(w)))
		}
		next.ServeHTTP(w, r)
	})
}

// streamCtl ends an ExecPty stream from the handler's side; its zero value
// (no controller in ctx) does nothing.
type streamCtl struct{ rc *http.ResponseController }

func streamControl(ctx context.Context) streamCtl {
	rc, _ := ctx.Value(streamCtlKey{}).(*http.ResponseController)
	return streamCtl{rc: rc}
}

// endReceive makes a blocked or later Receive fail.
func (c streamCtl) endReceive() {
	if c.rc != nil {
		_ = c.rc.SetReadDeadline(time.Unix(1, 0))
	}
}

// reset makes a blocked or later Send fail (and Receive).
func (c streamCtl) reset() {
	if c.rc != nil {
		_ = c.rc.SetWriteDeadline(time.Unix(1, 0))
		_ = c.rc.SetReadDeadline(time.Unix(1, 0))
	}
}
