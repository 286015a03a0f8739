package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"connectrpc.com/connect"

	v1 "github.com/forkbox/forkbox/api/forkbox/v1"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/agent"
	"github.com/forkbox/forkbox/internal/daemon"
)

// MaxPtyInput bounds one input message of ExecPty.
const MaxPtyInput = 64 << 10

// ExecPty runs a command on a terminal: the first message starts it, then
// input, resize and kill messages drive it while its output streams back.
// A bad message after the start (too much input at once, a size out of
// bounds, a second start) kills the session and fails the call with
// InvalidArgument.
func (s *sandboxes) ExecPty(ctx context.Context, stream *connect.BidiStream[v1.PtyRequest, v1.PtyResponse]) error {
	first, err := stream.Receive()
	if err != nil {
		if errors.Is(err, io.EOF) {
			return fmt.Errorf("exec pty: no start message: %w", errdefs.ErrInvalidArgument)
		}
		return err
	}
	m := first.GetStart()
	if m == nil {
		return fmt.Errorf("exec pty: the first message must be start: %w", errdefs.ErrInvalidArgument)
	}
	timeout, err := execTimeout(m.TimeoutMs)
	if err != nil {
		return err
	}
	size, err := ptySize(m.Size)
	if err != nil {
		return err
	}
	sess, err := s.d.Pty(ctx, m.Sandbox, daemon.PtyOptions{
		ExecRequest: agent.ExecRequest{Argv: m.Argv, Shell: m.Shell, Env: m.Env, Cwd: m.Cwd, Timeout: timeout},
		Size:        size,
	})
	if err != nil {
		return err
	}
	defer sess.Close()
	if err := stream.Send(&v1.PtyResponse{Event: &v1.PtyResponse_Started{Started: &v1.ExecStarted{ExecId: sess.ExecID, Pid: int64(sess.Pid())}}}); err != nil {
		return err // Close records the exec as finished (canceled)
	}
	ctl := streamControl(ctx)
	// The reader ends when the caller closes its side, or when ctl ends it;
	// it is joined on every path.
	var (
		mu     sync.Mutex
		badMsg error
	)
	recvDone := make(chan struct{})
	go func() {
		defer close(recvDone)
		for {
			msg, err := stream.Receive()
			if err != nil {
				if errors.Is(err, io.EOF) {
					sess.CloseInput()
				}
				return
			}
			if err := ptyMessage(sess, msg); err != nil {
				mu.Lock()
				badMsg = err
				mu.Unlock()
				sess.Kill()
				return
			}
		}
	}()
	joinReader := func() {
		ctl.endReceive()
		<-recvDone
	}
	out := newPtyOutput(sess.StallTimeout, func(b []byte) error {
		return stream.Send(&v1.PtyResponse{Event: &v1.PtyResponse_Data{Data: b}})
	})
	res, err := sess.Wait(ctx, out.push)
	if err != nil {
		// The session is over (a stalled caller, a gone agent): kill what is
		// left before the stream goes.
		sess.Close()
	}
	// What is queued still goes to a caller that reads, for a bounded time.
	flush := closeWait
	if errdefs.IsResourceExhausted(err) {
		flush = 0
	}
	sendErr := out.close(flush, ctl.reset)
	mu.Lock()
	bad := badMsg
	mu.Unlock()
	if bad != nil {
		joinReader()
		return bad
	}
	if err != nil {
		joinReader()
		return err
	}
	if sendErr == nil {
		sendErr = stream.Send(&v1.PtyResponse{Event: &v1.PtyResponse_Exit{Exit: &v1.ExecExit{
			ExitCode: int32(res.ExitCode), Signal: res.Signal, DurationMs: float64(res.Duration.Microseconds()) / 1000,
			TimedOut: res.TimedOut, OomKilled: res.OOMKilled,
		}}})
	}
	if sendErr != nil {
		joinReader()
		return sendErr
	}
	// The SDKs close their side on exit. Returning before they did resets
	// the stream, which HTTP/2 clients (Node's) report as an error that can
	// overtake the exit; so wait for it, a bounded time.
	t := time.NewTimer(closeWait)
	defer t.Stop()
	select {
	case <-recvDone:
	case <-t.C:
	case <-ctx.Done():
	}
	joinReader()
	return nil
}

// closeWait bounds how long ExecPty waits, after the exit, for the caller
// to close its side of the stream.
const closeWait = 5 * time.Second

// ptyMessage applies one message after the start.
func ptyMessage(sess *daemon.PtySession, msg *v1.PtyRequest) error {
	switch ev := msg.Event.(type) {
	case *v1.PtyRequest_Input:
		if len(ev.Input) > MaxPtyInput {
			return fmt.Errorf("exec pty: input message of %d bytes, more than %d: %w", len(ev.Input), MaxPtyInput, errdefs.ErrInvalidArgument)
		}
		sess.Input(ev.Input)
	case *v1.PtyRequest_Resize:
		sz, err := ptySize(ev.Resize)
		if err != nil {
			return err
		}
		if sz.Rows == 0 || sz.Cols == 0 {
			return fmt.Errorf("exec pty: resize to %dx%d: %w", sz.Rows, sz.Cols, errdefs.ErrInvalidArgument)
		}
		sess.Resize(sz)
	case *v1.PtyRequest_Kill:
		sess.Kill()
	case *v1.PtyRequest_Start:
		return fmt.Errorf("exec pty: a second start message: %w", errdefs.ErrInvalidArgument)
	default:
		return fmt.Errorf("exec pty: empty message: %w", errdefs.ErrInvalidArgument)
	}
	return nil
}

// ptySize converts a size, checking its bounds (zero fields stay zero).
func ptySize(sz *v1.PtySize) (agent.PtySize, error) {
	if sz == nil {
		return agent.PtySize{}, nil
	}
	if sz.Rows > agent.MaxPtyRows || sz.Cols > agent.MaxPtyCols {
		return agent.PtySize{}, fmt.Errorf("terminal size %dx%d: at most %dx%d: %w", sz.Rows, sz.Cols, agent.MaxPtyRows, agent.MaxPtyCols, errdefs.ErrInvalidArgument)
	}
	return agent.PtySize{Rows: int(sz.Rows), Cols: int(sz.Cols)}, nil
}
