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

	d        *Daemon
	sb       *store.Sandbox
	start    time.Time
	oomBase  int64
	oomErr   error
	doneOnce sync.Once
	done     func()
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
	execID := newID("ex-")
	data := d.recordedExec(sb.ID, execID, &eo, false)
	data["pty"] = true
	data["rows"], data["cols"] = size.Rows, size.Cols
	if _, err := d.store.AppendEvent(ctx, sb.ID, store.EventExecStarted, data); err != nil {
		return nil, err
	}
	req, err := d.withCredentials(ctx, sb, o.ExecRequest)
	if err != nil {
		return nil, err
	}
	s := &PtySession{ExecID: execID, d: d, sb: sb, done: done}
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
// releases the sandbox.
func (s *PtySession) Close() {
	s.Pty.Close()
	s.doneOnce.Do(s.done)
}

func (s *PtySession) finish(ctx context.Context, res ExecResult, err error) {
	data := map[string]any{"exec_id": s.ExecID, "duration_ms": float64(time.Since(s.start).Microseconds()) / 1000}
	if err != nil {
		data["error"] = err.Error()
	} else {
		data["exit_code"] = res.ExitCode
		data["signal"] = res.Signal
		data["timed_out"] = res.TimedOut
		data["oom_killed"] = res.OOMKilled
	}
	s.d.note(context.WithoutCancel(ctx), s.sb.ID, store.EventExecFinished, data)
	s.doneOnce.Do(s.done)
}
