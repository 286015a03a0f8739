// Package crun drives the crun binary as a forkbox runtime.Runtime, the way
// containerd's go-runc drives runc: one crun command per call, with the
// state root in front. crun runs sandboxes as ordinary Linux containers
// (namespaces, cgroups, capabilities, seccomp): the fastest start, for
// trusted code. Harden adds the seccomp profile crun needs on top of the
// spec from runtime/spec (gVisor has its own syscall filter).
//
// On hosts in cgroup "hybrid" mode (v1 controllers plus a cgroup2 hierarchy
// at /sys/fs/cgroup/unified) every crun command runs in a fresh private
// mount namespace without that v2 hierarchy; see cgroupmode.go.
package crun

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/runtime"
	"github.com/forkbox/forkbox/internal/runtime/ocicli"
)

// Options configure the crun driver. Zero values take the defaults noted.
type Options struct {
	Binary string // default "crun" from PATH
	Root   string // state root (crun --root); default /run/forkbox/crun
	LogDir string // crun's own error log for run (one file per container); empty = into the bundle's stdio.log
	Log    *slog.Logger
}

// Crun is the crun driver. The zero value is not usable; call New.
type Crun struct {
	// Tool implements State, List, Kill, Pause, Resume and the crun
	// command of Delete.
	ocicli.Tool
	opts Options
	log  *slog.Logger
	// hybrid is the cgroup2 mount point to hide from crun ("" = run crun
	// directly); see detectHybrid.
	hybrid string
}

var _ runtime.Runtime = (*Crun)(nil)

// New returns a driver with o's defaults filled in. It checks that the binary
// exists (Unavailable if not), creates the state root and detects the host's
// cgroup mode.
func New(o Options) (*Crun, error) {
	if o.Binary == "" {
		o.Binary = "crun"
	}
	bin, err := exec.LookPath(o.Binary)
	if err != nil {
		return nil, fmt.Errorf("crun: binary %q: %v: %w", o.Binary, err, errdefs.ErrUnavailable)
	}
	o.Binary = bin
	if o.Root == "" {
		o.Root = "/run/forkbox/crun"
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	for _, d := range []string{o.Root, o.LogDir} {
		if d == "" {
			continue
		}
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("crun: %v: %w", err, errdefs.ErrInternal)
		}
	}
	c := &Crun{opts: o, log: o.Log.With("runtime", "crun")}
	c.Tool = ocicli.Tool{Runtime: "crun", Command: c.command, Convert: toState,
		Forget: func(id string) { os.RemoveAll(filepath.Join(o.Root, id)) }} // crun's own dir, if only partly written
	c.hybrid, err = detectHybrid(cgroupRoot)
	if err != nil {
		return nil, err
	}
	if c.hybrid != "" {
		c.log.Debug("cgroup hybrid mode: crun runs in a private mount namespace without the v2 hierarchy", "hidden", c.hybrid)
	}
	return c, nil
}

// Name implements runtime.Runtime.
func (c *Crun) Name() string { return "crun" }

// Root returns the state root the driver passes to crun.
func (c *Crun) Root() string { return c.opts.Root }

// cmd returns the crun command with the global flags in front of args.
func (c *Crun) cmd(ctx context.Context, global []string, args ...string) *exec.Cmd {
	a := append([]string{"--root", c.opts.Root}, global...)
	cmd := exec.CommandContext(ctx, c.opts.Binary, append(a, args...)...)
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

// command runs crun with args and returns stdout. On failure the error
// carries crun's stderr, classified by classify.
func (c *Crun) command(ctx context.Context, id string, args ...string) ([]byte, error) {
	cmd := c.cmd(ctx, nil, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := c.start(cmd)
	if err == nil {
		err = cmd.Wait()
	}
	if err != nil {
		return nil, c.wrap(ctx, args[0], id, err, stderr.String())
	}
	return stdout.Bytes(), nil
}

// errs classifies crun's messages. Unlike runsc, crun's AlreadyExists rule
// comes before NotFound (kept as it was), and crun words an illegal
// transition its own way.
var errs = ocicli.Errors{Runtime: "crun", Rules: []ocicli.Rule{
	ocicli.AlreadyExists,
	ocicli.NotFound,
	ocicli.Precondition("not in `created` or `stopped` state", "already paused"),
}}

// wrap turns a failed crun command into an error of the right class.
func (c *Crun) wrap(ctx context.Context, verb, id string, err error, stderr string) error {
	return errs.Wrap(ctx, verb, id, err, stderr)
}

func validID(id string) error { return ocicli.ValidID("crun", id) }

// toState converts crun's report. crun reports the dead init's pid for a
// stopped container; runtime.State has 0 then (runsc needs no such fix).
func toState(s ocicli.State) runtime.State {
	st := s.Runtime()
	if st.Status == runtime.StatusStopped {
		st.Pid = 0
	}
	return st
}
