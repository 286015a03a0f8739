package daemon

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/agent"
	"github.com/forkbox/forkbox/internal/cgroups"
	"github.com/forkbox/forkbox/internal/store"
)

// ExecOptions is one command to run in a sandbox.
type ExecOptions struct {
	agent.ExecRequest
	// NonReplayable execs are skipped by Resume.
	NonReplayable bool
}

// ExecResult is how a command ended.
type ExecResult = agent.ExecResult

const (
	maxArgvBytes  = 1 << 20
	maxStdinBytes = 16 << 20
)

// running returns a sandbox that must be running, marked busy (call done
// when the operation ends) so that idle hibernation leaves it alone. A
// hibernated sandbox is woken first: the next exec wakes it.
func (d *Daemon) running(ctx context.Context, idOrName string) (_ *store.Sandbox, done func(), err error) {
	sb, err := d.store.GetSandbox(ctx, idOrName)
	if err != nil {
		return nil, nil, err
	}
	release := d.busy(sb.ID)
	defer func() {
		if err != nil {
			release()
		}
	}()
	if sb.State == store.StateHibernating {
		// A hibernation in progress holds the lock: wait for it, then wake.
		unlock := d.lock(sb.ID)
		unlock()
		if sb, err = d.store.GetSandbox(ctx, sb.ID); err != nil {
			return nil, nil, err
		}
	}
	if sb.State == store.StateHibernated {
		if sb, err = d.Wake(ctx, sb.ID); err != nil {
			return nil, nil, err
		}
	}
	if sb.State != store.StateRunning {
		return nil, nil, fmt.Errorf("sandbox %s is %s, not running: %w", sb.ID, sb.State, errdefs.ErrFailedPrecondition)
	}
	return sb, release, nil
}

func checkExec(o *ExecOptions) error {
	if len(o.Argv) == 0 && o.Shell == "" {
		return fmt.Errorf("exec needs a command (argv or shell): %w", errdefs.ErrInvalidArgument)
	}
	if len(o.Argv) > 0 && o.Shell != "" {
		return fmt.Errorf("exec takes argv or shell, not both: %w", errdefs.ErrInvalidArgument)
	}
	n := len(o.Shell)
	for _, a := range o.Argv {
		n += len(a)
	}
	for k, v := range o.Env {
		if !envKeyRE.MatchString(k) {
			return fmt.Errorf("env name %q is not a valid variable name: %w", k, errdefs.ErrInvalidArgument)
		}
		n += len(k) + len(v)
	}
	if n > maxArgvBytes {
		return fmt.Errorf("command and env are %d bytes, more than %d: %w", n, maxArgvBytes, errdefs.ErrResourceExhausted)
	}
	if len(o.Stdin) > maxStdinBytes {
		return fmt.Errorf("stdin is %d bytes, more than %d: %w", len(o.Stdin), maxStdinBytes, errdefs.ErrResourceExhausted)
	}
	if o.Timeout < 0 {
		return fmt.Errorf("timeout %s is negative: %w", o.Timeout, errdefs.ErrInvalidArgument)
	}
	return nil
}

// Exec runs a command in a sandbox, streaming its output to stdout and
// stderr, and records exec.started and exec.finished in the ledger.
func (d *Daemon) Exec(ctx context.Context, idOrName string, o ExecOptions, stdout, stderr io.Writer) (ExecResult, error) {
	if err := checkExec(&o); err != nil {
		return ExecResult{}, err
	}
	ph := d.newExecPhases(ctx)
	sb, done, err := d.running(ctx, idOrName)
	if err != nil {
		return ExecResult{}, err
	}
	defer done()
	ph.mark("lookup")
	req, execID, err := d.beginExec(ctx, sb, &o, false, nil)
	if err != nil {
		return ExecResult{}, err
	}
	ph.mark("ledger_started")
	// Under crun the kernel's OOM killer does the killing: it is seen in
	// the cgroup's oom_kill count (under gVisor the agent reports it).
	oomBefore, oomErr := cgroups.OOMKills(d.cgroupPath(sb.ID))
	start := time.Now()
	w := watchExec(ctx, req.Timeout)
	res, err := d.agent(sb).Exec(w.ctx, req, w.writer(stdout), w.writer(stderr))
	err = d.diedUnder(ctx, sb, w.done(err))
	ph.mark("agent")
	if err == nil && sb.Runtime == RuntimeCrun && res.Signal == "SIGKILL" && oomErr == nil {
		if after, err := cgroups.OOMKills(d.cgroupPath(sb.ID)); err == nil && after > oomBefore {
			res.OOMKilled = true
		}
	}
	d.note(ctx, sb.ID, store.EventExecFinished, execFinished(execID, start, res, err))
	ph.mark("ledger_finished")
	ph.log(ctx, d.log, sb.ID)
	return res, err
}

// clipSignal bounds the signal name an agent reported (the sandbox's own
// word) as the ledger keeps it: names are short ("SIGKILL").
func clipSignal(s string) string {
	const max = 32
	if len(s) > max {
		return s[:max]
	}
	return s
}

// execFinished is the data of an exec.finished event: how the exec ended
// (or the error that ended it) and how long it ran.
func execFinished(execID string, start time.Time, res ExecResult, err error) map[string]any {
	data := map[string]any{"exec_id": execID, "duration_ms": float64(time.Since(start).Microseconds()) / 1000}
	if err != nil {
		data["error"] = err.Error()
	} else {
		data["exit_code"] = res.ExitCode
		data["signal"] = clipSignal(res.Signal)
		data["timed_out"] = res.TimedOut
		data["oom_killed"] = res.OOMKilled
	}
	return data
}

// Start runs a command in the background and returns its pid.
func (d *Daemon) Start(ctx context.Context, idOrName string, o ExecOptions) (int, error) {
	if err := checkExec(&o); err != nil {
		return 0, err
	}
	sb, done, err := d.running(ctx, idOrName)
	if err != nil {
		return 0, err
	}
	defer done()
	req, _, err := d.beginExec(ctx, sb, &o, true, nil)
	if err != nil {
		return 0, err
	}
	return d.agent(sb).Start(ctx, req)
}

// beginExec makes the request sent to the agent (withCredentials) and then
// records exec.started (recordedExec, with extra's additions) under a new
// exec id. In that order: once exec.started is written the exec reaches
// the agent, whose answer (or error) the caller records as exec.finished,
// so no exec.started is left without its end.
func (d *Daemon) beginExec(ctx context.Context, sb *store.Sandbox, o *ExecOptions, background bool, extra func(map[string]any)) (agent.ExecRequest, string, error) {
	req, err := d.withCredentials(ctx, sb, o.ExecRequest)
	if err != nil {
		return agent.ExecRequest{}, "", err
	}
	execID := newID("ex-")
	data := d.recordedExec(sb.ID, execID, o, background)
	if extra != nil {
		extra(data)
	}
	if _, err := d.store.AppendEvent(ctx, sb.ID, store.EventExecStarted, data); err != nil {
		return agent.ExecRequest{}, "", err
	}
	return req, execID, nil
}

// withCredentials adds the sandbox's env and env credentials to an exec
// (the credentials win over the sandbox's env, the exec's own env over
// both), and the sandbox's working directory when the exec names none.
// The sandbox's env is its agent's already, but for a sandbox restored
// from a memory image: its agent's env is the source's, and the env a
// fork or restore gave it (sb.Config.Env) would reach no exec. Only the
// request sent to the agent carries them: the ledger records the exec as
// the caller gave it.
func (d *Daemon) withCredentials(ctx context.Context, sb *store.Sandbox, req agent.ExecRequest) (agent.ExecRequest, error) {
	if req.Cwd == "" {
		req.Cwd = sb.Config.Cwd
	}
	creds, err := d.credentialEnv(ctx, sb)
	if err != nil {
		return req, err
	}
	if len(creds) == 0 && len(sb.Config.Env) == 0 {
		return req, nil
	}
	env := make(map[string]string, len(sb.Config.Env)+len(creds)+len(req.Env))
	for k, v := range sb.Config.Env {
		env[k] = v
	}
	for k, v := range creds {
		env[k] = v
	}
	for k, v := range req.Env {
		env[k] = v
	}
	req.Env = env
	return req, nil
}

// ReadFile reads a file in a sandbox.
func (d *Daemon) ReadFile(ctx context.Context, idOrName, path string) ([]byte, error) {
	sb, done, err := d.running(ctx, idOrName)
	if err != nil {
		return nil, err
	}
	defer done()
	return d.agent(sb).ReadFile(ctx, path)
}

// WriteFile writes a file in a sandbox.
func (d *Daemon) WriteFile(ctx context.Context, idOrName, path string, data []byte, mode uint32) error {
	sb, done, err := d.running(ctx, idOrName)
	if err != nil {
		return err
	}
	defer done()
	if mode == 0 {
		mode = 0o644
	}
	if err := d.agent(sb).WriteFile(ctx, path, data, fsMode(mode)); err != nil {
		return err
	}
	_, err = d.store.AppendEvent(ctx, sb.ID, store.EventFileWritten, d.recordedWrite(sb.ID, path, data, mode))
	return err
}

// ListFiles lists a directory in a sandbox.
func (d *Daemon) ListFiles(ctx context.Context, idOrName, path string) ([]agent.FileInfo, error) {
	sb, done, err := d.running(ctx, idOrName)
	if err != nil {
		return nil, err
	}
	defer done()
	return d.agent(sb).ListFiles(ctx, path)
}
