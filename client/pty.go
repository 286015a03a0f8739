package client

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
	"github.com/forkbox/forkbox/errdefs/errconnect"
)

// PtyOptions is a command to run on a terminal. Give Command (argv), or
// Shell (run by /bin/sh -c).
type PtyOptions struct {
	Command []string
	Shell   string
	Env     map[string]string
	Cwd     string
	// Rows and Cols are the terminal's size (0: 24 rows, 80 columns; at
	// most 1000 each).
	Rows, Cols int
	// Timeout kills the command's session after this long (0: never).
	Timeout time.Duration
	// OnData gets what the terminal prints, as it comes, on one goroutine.
	// It must not block for long: output waits for it.
	OnData func([]byte)
}

// Pty is a command running on a terminal in a sandbox. Its methods may be
// called from any goroutine. The stream lives as long as the context given
// to Sandbox.Pty: cancelling it kills the command's session.
type Pty struct {
	// ExecID is the exec's id in the ledger; Pid its pid in the sandbox.
	ExecID string
	Pid    int

	stream    *connect.BidiStreamForClient[v1.PtyRequest, v1.PtyResponse]
	cancel    context.CancelFunc
	sendMu    sync.Mutex
	reqClosed bool
	done      chan struct{}
	res       *ExecResult
	err       error
}

// ptyChunk is the most input sent in one message (the daemon takes 64 KiB).
const ptyChunk = 32 << 10

// Pty starts a command on a new terminal in the sandbox and returns once it
// runs. The daemon must be reachable over HTTP/2 (it is, on its socket and
// on TCP).
func (s *Sandbox) Pty(ctx context.Context, o PtyOptions) (*Pty, error) {
	if o.Rows < 0 || o.Cols < 0 {
		return nil, fmt.Errorf("terminal size %dx%d: %w", o.Rows, o.Cols, errdefs.ErrInvalidArgument)
	}
	ctx, cancel := context.WithCancel(ctx)
	stream := s.c.sbx2.ExecPty(ctx)
	p := &Pty{stream: stream, cancel: cancel, done: make(chan struct{})}
	err := stream.Send(&v1.PtyRequest{Event: &v1.PtyRequest_Start{Start: &v1.PtyStart{
		Sandbox: s.ID, Argv: o.Command, Shell: o.Shell, Env: o.Env, Cwd: o.Cwd,
		TimeoutMs: o.Timeout.Milliseconds(), Size: &v1.PtySize{Rows: uint32(o.Rows), Cols: uint32(o.Cols)},
	}}})
	if err != nil && !errors.Is(err, io.EOF) {
		cancel()
		return nil, errconnect.FromConnect(err)
	}
	// On io.EOF from Send the server already answered: Receive has it.
	first, err := stream.Receive()
	if err != nil {
		cancel()
		return nil, errconnect.FromConnect(err)
	}
	st := first.GetStarted()
	if st == nil {
		cancel()
		return nil, fmt.Errorf("exec pty: the daemon did not answer with started: %w", errdefs.ErrInternal)
	}
	p.ExecID, p.Pid = st.ExecId, int(st.Pid)
	go p.receive(o.OnData)
	return p, nil
}

// receive reads the output and the exit until the stream ends.
func (p *Pty) receive(onData func([]byte)) {
	defer close(p.done)
	defer p.cancel()
	defer p.stream.CloseResponse()
	for {
		msg, err := p.stream.Receive()
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = nil
			}
			if p.res == nil {
				if err == nil {
					err = connect.NewError(connect.CodeUnavailable, io.ErrUnexpectedEOF)
				}
				p.err = errconnect.FromConnect(err)
			}
			return
		}
		switch ev := msg.Event.(type) {
		case *v1.PtyResponse_Data:
			if onData != nil {
				onData(ev.Data)
			}
		case *v1.PtyResponse_Exit:
			p.closeRequest() // the daemon waits for it before it ends the stream
			x := ev.Exit
			p.res = &ExecResult{ExitCode: int(x.ExitCode), Signal: x.Signal, TimedOut: x.TimedOut, OOMKilled: x.OomKilled,
				Duration: time.Duration(x.DurationMs * float64(time.Millisecond))}
		}
	}
}

func (p *Pty) send(m *v1.PtyRequest) error {
	p.sendMu.Lock()
	defer p.sendMu.Unlock()
	if p.reqClosed {
		return fmt.Errorf("exec pty: the session has ended: %w", errdefs.ErrFailedPrecondition)
	}
	if err := p.stream.Send(m); err != nil {
		if errors.Is(err, io.EOF) {
			// The stream is over: its error (or exit) is what Wait returns.
			return fmt.Errorf("exec pty: the session has ended: %w", errdefs.ErrFailedPrecondition)
		}
		return errconnect.FromConnect(err)
	}
	return nil
}

// SendInput sends b to the terminal as typed keys (Ctrl-C is 0x03).
func (p *Pty) SendInput(b []byte) error {
	for len(b) > 0 {
		n := min(len(b), ptyChunk)
		if err := p.send(&v1.PtyRequest{Event: &v1.PtyRequest_Input{Input: b[:n]}}); err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}

// Resize sets the terminal's size; the foreground program gets SIGWINCH.
func (p *Pty) Resize(rows, cols int) error {
	if rows < 1 || cols < 1 {
		return fmt.Errorf("terminal size %dx%d: %w", rows, cols, errdefs.ErrInvalidArgument)
	}
	return p.send(&v1.PtyRequest{Event: &v1.PtyRequest_Resize{Resize: &v1.PtySize{Rows: uint32(rows), Cols: uint32(cols)}}})
}

// Kill kills every process of the terminal's session; Wait then returns
// the result (SIGKILL).
func (p *Pty) Kill() error {
	return p.send(&v1.PtyRequest{Event: &v1.PtyRequest_Kill{Kill: &v1.PtyKill{}}})
}

// Wait waits for the command to end and returns how it ended, after all
// its output went to OnData.
func (p *Pty) Wait() (*ExecResult, error) {
	<-p.done
	return p.res, p.err
}

// Close ends the stream (the session is killed if it still runs) and
// waits for the receiving goroutine.
func (p *Pty) Close() error {
	p.cancel()
	// The transport watches the cancelled context only once the request
	// body ends: closing it first is what unblocks the receiving side.
	err := p.closeRequest()
	<-p.done
	return err
}

// closeRequest closes the sending side once; later sends are refused.
func (p *Pty) closeRequest() error {
	p.sendMu.Lock()
	defer p.sendMu.Unlock()
	if p.reqClosed {
		return nil
	}
	p.reqClosed = true
	return p.stream.CloseRequest()
}
