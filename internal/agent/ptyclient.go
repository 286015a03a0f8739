package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"

	"github.com/forkbox/forkbox/errdefs"
)

// Pty is a command running on a terminal in the sandbox (Client.Pty). Input,
// Resize, Kill and CloseInput may be called from any goroutine, Wait from
// one. Its I/O is bound to the context given to Client.Pty: when that ends
// the connection is closed and the agent kills the session.
type Pty struct {
	cl  *call
	ctx context.Context
	pid int
	fw  *frameWriter // unbuffered: every frame goes out at once

	closeOnce sync.Once
}

// Pty starts req on a new terminal of the given size (zero fields: 24x80)
// and returns once the process runs. req.Stdin must be empty: a terminal's
// input is sent with Input.
func (c *Client) Pty(ctx context.Context, req ExecRequest, size PtySize) (*Pty, error) {
	if len(req.Stdin) > 0 {
		return nil, fmt.Errorf("agent pty: stdin is sent as terminal input, not with the request: %w", errdefs.ErrInvalidArgument)
	}
	size, err := CheckPtySize(size)
	if err != nil {
		return nil, err
	}
	cl, err := c.open(ctx, request{Op: opPty, Exec: &req, Pty: &size})
	if err != nil {
		return nil, err
	}
	if err := cl.bw.Flush(); err != nil {
		cl.close()
		return nil, fmt.Errorf("agent pty: %v: %w", err, errdefs.ErrUnavailable)
	}
	p := &Pty{cl: cl, ctx: ctx, fw: &frameWriter{w: cl.conn}}
	// The first answer is the started frame, or the error that prevented it.
	var st startResult
	if err := cl.result(ctx, opPty, nil, &st, frameStarted); err != nil {
		cl.close()
		return nil, err
	}
	p.pid = st.Pid
	return p, nil
}

// Pid is the process's pid in the sandbox.
func (p *Pty) Pid() int { return p.pid }

// Input sends b to the terminal, as typed keys.
func (p *Pty) Input(b []byte) error {
	for len(b) > 0 {
		n := min(len(b), chunkSize)
		if err := p.send(frameData, streamStdin, b[:n]); err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}

// Resize sets the terminal's size; the foreground job gets SIGWINCH.
func (p *Pty) Resize(size PtySize) error {
	if err := size.check(false); err != nil {
		return err
	}
	b, _ := json.Marshal(size)
	return p.send(frameResize, 0, b)
}

// Kill kills every process of the terminal's session.
func (p *Pty) Kill() error { return p.send(frameKill, 0, nil) }

// CloseInput says no more input follows. The command keeps running.
func (p *Pty) CloseInput() error { return p.send(frameEOF, streamStdin, nil) }

func (p *Pty) send(typ, stream byte, b []byte) error {
	if err := p.fw.write(typ, stream, b); err != nil {
		if p.ctx.Err() != nil {
			return ctxErr(p.ctx, opPty)
		}
		return fmt.Errorf("agent pty: send: %v: %w", err, errdefs.ErrUnavailable)
	}
	return nil
}

// Wait passes what the terminal prints to onData as it comes and returns
// how the command ended. An error from onData ends the wait with it (and,
// with Close, the session).
func (p *Pty) Wait(onData func([]byte) error) (ExecResult, error) {
	var res ExecResult
	err := p.cl.result(p.ctx, opPty, func(_ byte, b []byte) error {
		if onData == nil {
			return nil
		}
		return onData(b)
	}, &res, frameResult)
	p.cl.stopWrites() // the session is over
	return res, err
}

// Close closes the connection; a session still running is killed.
func (p *Pty) Close() {
	p.closeOnce.Do(p.cl.close)
}
