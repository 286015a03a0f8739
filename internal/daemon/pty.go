package daemon

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/agent"
	"github.com/forkbox/forkbox/internal/cgroups"
	"github.com/forkbox/forkbox/internal/store"
)

// Bounds of pty sessions.
const (
	// MaxPtySessions bounds the pty sessions open at once on one sandbox;
	// past it, Pty fails with ResourceExhausted.
	MaxPtySessions = 16
	// DefaultPtyStallTimeout is Config.PtyStallTimeout's default: a session
	// whose client took none of its output for this long is ended.
	DefaultPtyStallTimeout = 60 * time.Second
)

// PtyOptions is one command to run on a terminal in a sandbox. Stdin must
// be empty (input goes through PtySession.Input); a pty exec is never
// replayed by Resume (it is interactive).
type PtyOptions struct {
	agent.ExecRequest
	Size agent.PtySize
}

// PtySession is a command running on a terminal in a sandbox. The
// sandbox counts as busy (no idle hibernation) until Wait returns or Close.
type PtySession struct {
	*agent.Pty
	// ExecID is the exec's id in the ledger.
	ExecID string
	// StallTimeout is Config.PtyStallTimeout: how long the caller of Wait
	// may take none of the output before it ends the session.
	StallTimeout time.Duration

	d          *Daemon
	sb         *store.Sandbox
	start      time.Time
	oomBase    int64
	oomErr     error
	finishOnce sync.Once // exec.finished is written once
	doneOnce   sync.Once
	done       func()
}

// Pty starts a command on a terminal in a sandbox and records exec.started
// (with "pty": true) in the ledger. The session lives as long as ctx: when
// it ends, the command's session is killed. The caller must call Wait or
// Close.
func (d *Daemon) Pty(ctx context.Context, idOrName string, o PtyOptions) (*PtySession, error) {
	eo := ExecOptions{ExecRequest: o.ExecRequest, NonReplayable: true}
	if err := checkExec(&eo); err != nil {
		return nil, err
	}
	if len(o.Stdin) > 0 {
		return nil, fmt.Errorf("a pty exec takes its input as terminal input, not stdin: %w", errdefs.ErrInvalidArgument)
	}
	size, err := agent.CheckPtySize(o.Size)
	if err != nil {
		return nil, err
	}
	sb, done, err := d.running(ctx, idOrName)
	if err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			done()
		}
	}()
	release, err := d.ptySlot(sb.ID)
	if err != nil {
		return nil, err
	}
	sbDone := done
	done = func() {
		release()
		sbDone()
	}
	req, execID, err := d.beginExec(ctx, sb, &eo, false, func(data map[string]any) {
		data["pty"] = true
		data["rows"], data["cols"] = size.Rows, size.Cols
	})
	if err != nil {
		return nil, err
	}
	s := &PtySession{ExecID: execID, StallTimeout: d.cfg.PtyStallTimeout, d: d, sb: sb, done: done}
	s.oomBase, s.oomErr = cgroups.OOMKills(d.cgroupPath(sb.ID))
	s.start = time.Now()
	p, err := d.agent(sb).Pty(ctx, req, size)
	if err != nil {
		ok = true // finish releases the sandbox
		s.finish(ctx, ExecResult{}, err)
		return nil, err
	}
	s.Pty = p
	ok = true
	return s, nil
}

// Wait passes what the terminal prints to onData until the command ends,
// records exec.finished and returns how it ended.
func (s *PtySession) Wait(ctx context.Context, onData func([]byte) error) (ExecResult, error) {
	res, err := s.Pty.Wait(onData)
	if err == nil && s.sb.Runtime == RuntimeCrun && res.Signal == "SIGKILL" && s.oomErr == nil {
		if after, err := cgroups.OOMKills(s.d.cgroupPath(s.sb.ID)); err == nil && after > s.oomBase {
			res.OOMKilled = true
		}
	}
	s.finish(ctx, res, err)
	return res, err
}

// Close ends the session (killing its command if it still runs) and
// releases the sandbox. A session closed before Wait returned is recorded
// as finished with a Canceled error.
func (s *PtySession) Close() {
	s.Pty.Close()
	s.finish(context.Background(), ExecResult{}, fmt.Errorf("pty session closed before its command ended: %w", errdefs.ErrCanceled))
}

// finish records exec.finished, the first time only, and releases the
// sandbox.
func (s *PtySession) finish(ctx context.Context, res ExecResult, err error) {
	s.finishOnce.Do(func() { s.record(ctx, res, err) })
	s.doneOnce.Do(s.done)
}

func (s *PtySession) record(ctx context.Context, res ExecResult, err error) {
	s.d.note(ctx, s.sb.ID, store.EventExecFinished, execFinished(s.ExecID, s.start, res, err))
}

// ptySlot takes one of sandbox id's MaxPtySessions; call the returned func
// to give it back.
func (d *Daemon) ptySlot(id string) (func(), error) {
	a := d.act()
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.ptys[id] >= MaxPtySessions {
		return nil, fmt.Errorf("sandbox %s has %d pty sessions open, the most it may: %w", id, MaxPtySessions, errdefs.ErrResourceExhausted)
	}
	a.ptys[id]++
	var once sync.Once
	return func() {
		once.Do(func() {
			a.mu.Lock()
			if a.ptys[id]--; a.ptys[id] <= 0 {
				delete(a.ptys, id)
			}
			a.mu.Unlock()
		})
	}, nil
}
