package daemon

import (
	"context"
	"time"

	"github.com/forkbox/forkbox/internal/agent"
	"github.com/forkbox/forkbox/internal/cgroups"
	"github.com/forkbox/forkbox/internal/store"
)

// This file holds the engine side of the file operations, signals, watches
// and streamed execs that the E2B-compatible endpoint (internal/e2b) serves:
// each checks the sandbox is running (waking a hibernated one) and goes to
// its agent, which bounds and confines them (see internal/agent/fsops.go).

// Stat describes a file in a sandbox.
func (d *Daemon) Stat(ctx context.Context, idOrName, path string) (agent.Entry, error) {
	sb, done, err := d.running(ctx, idOrName)
	if err != nil {
		return agent.Entry{}, err
	}
	defer done()
	return d.agent(sb).Stat(ctx, path)
}

// MakeDir creates a directory (and its parents) in a sandbox.
func (d *Daemon) MakeDir(ctx context.Context, idOrName, path string) (agent.Entry, error) {
	sb, done, err := d.running(ctx, idOrName)
	if err != nil {
		return agent.Entry{}, err
	}
	defer done()
	return d.agent(sb).MakeDir(ctx, path)
}

// Move renames a file or directory in a sandbox.
func (d *Daemon) Move(ctx context.Context, idOrName, src, dst string) (agent.Entry, error) {
	sb, done, err := d.running(ctx, idOrName)
	if err != nil {
		return agent.Entry{}, err
	}
	defer done()
	return d.agent(sb).Move(ctx, src, dst)
}

// Remove removes a file or a directory tree in a sandbox.
func (d *Daemon) Remove(ctx context.Context, idOrName, path string) error {
	sb, done, err := d.running(ctx, idOrName)
	if err != nil {
		return err
	}
	defer done()
	return d.agent(sb).Remove(ctx, path)
}

// Walk lists a directory of a sandbox to a depth.
func (d *Daemon) Walk(ctx context.Context, idOrName, path string, depth int) ([]agent.Entry, error) {
	sb, done, err := d.running(ctx, idOrName)
	if err != nil {
		return nil, err
	}
	defer done()
	return d.agent(sb).Walk(ctx, path, depth)
}

// Watch watches a directory of a sandbox until ctx ends (see
// agent.Client.Watch). The sandbox counts as busy meanwhile: it is not
// hibernated for idleness while watched.
func (d *Daemon) Watch(ctx context.Context, idOrName, path string, recursive bool, started func(), onEvents func([]agent.WatchEvent) error) error {
	sb, done, err := d.running(ctx, idOrName)
	if err != nil {
		return err
	}
	defer done()
	return d.agent(sb).Watch(ctx, path, recursive, started, onEvents)
}

// Signal sends a signal to the process group of a running exec (by pid) of
// a sandbox.
func (d *Daemon) Signal(ctx context.Context, idOrName string, pid, sig int) error {
	sb, done, err := d.running(ctx, idOrName)
	if err != nil {
		return err
	}
	defer done()
	return d.agent(sb).Signal(ctx, pid, sig)
}

// ExecStream runs a command as Exec does, with its input streamed from
// eio.Stdin and its pid reported when it started (agent.ExecIO). An exec
// with streamed input is recorded as non-replayable: its input is not kept.
func (d *Daemon) ExecStream(ctx context.Context, idOrName string, o ExecOptions, eio agent.ExecIO) (ExecResult, error) {
	if err := checkExec(&o); err != nil {
		return ExecResult{}, err
	}
	if eio.Stdin != nil {
		o.NonReplayable = true
	}
	sb, done, err := d.running(ctx, idOrName)
	if err != nil {
		return ExecResult{}, err
	}
	defer done()
	req, execID, err := d.beginExec(ctx, sb, &o, false, nil)
	if err != nil {
		return ExecResult{}, err
	}
	oomBefore, oomErr := cgroups.OOMKills(d.cgroupPath(sb.ID))
	start := time.Now()
	w := watchExec(ctx, req.Timeout)
	eio.Stdout, eio.Stderr = w.writer(eio.Stdout), w.writer(eio.Stderr)
	res, err := d.agent(sb).ExecStream(w.ctx, req, eio)
	err = d.diedUnder(ctx, sb, w.done(err))
	if err == nil && sb.Runtime == RuntimeCrun && res.Signal == "SIGKILL" && oomErr == nil {
		if after, err := cgroups.OOMKills(d.cgroupPath(sb.ID)); err == nil && after > oomBefore {
			res.OOMKilled = true
		}
	}
	d.note(ctx, sb.ID, store.EventExecFinished, execFinished(execID, start, res, err))
	return res, err
}

// Attach reattaches to a detached exec of a sandbox (agent.ExecIO.Detach)
// whose stream ended with its connection, as a hibernation ends it. The
// exec is in the ledger already; its end is not recorded again.
func (d *Daemon) Attach(ctx context.Context, idOrName string, pid int, eio agent.ExecIO) (ExecResult, error) {
	sb, done, err := d.running(ctx, idOrName)
	if err != nil {
		return ExecResult{}, err
	}
	defer done()
	return d.agent(sb).Attach(ctx, pid, eio)
}
