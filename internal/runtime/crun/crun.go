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
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/runtime"
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

// wrap turns a failed crun command into an error of the right class.
func (c *Crun) wrap(ctx context.Context, verb, id string, err error, stderr string) error {
	if ctx.Err() != nil {
		return fmt.Errorf("crun %s %s: %w", verb, id, ctx.Err())
	}
	msg := strings.TrimSpace(stderr)
	if msg == "" {
		msg = err.Error()
	}
	return fmt.Errorf("crun %s %s: %s: %w", verb, id, lastLines(msg, 5), classify(msg))
}

func classify(msg string) error {
	m := strings.ToLower(msg)
	switch {
	case strings.Contains(m, "already exists"):
		return errdefs.ErrAlreadyExists
	case strings.Contains(m, "does not exist") || strings.Contains(m, "no such file") || strings.Contains(m, "not found"):
		return errdefs.ErrNotFound
	case strings.Contains(m, "not in `created` or `stopped` state") || strings.Contains(m, "not running") ||
		strings.Contains(m, "already paused") || strings.Contains(m, "not paused"):
		return errdefs.ErrFailedPrecondition
	}
	return errdefs.ErrInternal
}

func lastLines(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

// validID rejects ids crun would refuse or that could escape the root.
func validID(id string) error {
	if id == "" || len(id) > 128 || strings.ContainsAny(id, "/\\ \t\n\x00") || id == "." || id == ".." {
		return fmt.Errorf("crun: container id %q is not valid: %w", id, errdefs.ErrInvalidArgument)
	}
	return nil
}

// ociState is `crun state` / `crun list --format json` output.
type ociState struct {
	ID     string `json:"id"`
	Pid    int    `json:"pid"`
	Status string `json:"status"`
	Bundle string `json:"bundle"`
}

func (s ociState) state() runtime.State {
	st := runtime.State{ID: s.ID, Status: s.Status, Pid: s.Pid, Bundle: s.Bundle}
	if st.Status == runtime.StatusStopped {
		st.Pid = 0 // crun reports the dead init's pid
	}
	return st
}

// State implements runtime.Runtime.
func (c *Crun) State(ctx context.Context, id string) (runtime.State, error) {
	if err := validID(id); err != nil {
		return runtime.State{}, err
	}
	out, err := c.command(ctx, id, "state", id)
	if err != nil {
		return runtime.State{}, err
	}
	var s ociState
	if err := json.Unmarshal(out, &s); err != nil {
		return runtime.State{}, fmt.Errorf("crun state %s: decode %q: %v: %w", id, out, err, errdefs.ErrInternal)
	}
	return s.state(), nil
}

// List implements runtime.Runtime.
func (c *Crun) List(ctx context.Context) ([]runtime.State, error) {
	out, err := c.command(ctx, "", "list", "--format", "json")
	if err != nil {
		return nil, err
	}
	var ss []ociState
	if t := bytes.TrimSpace(out); len(t) > 0 && !bytes.Equal(t, []byte("null")) {
		if err := json.Unmarshal(t, &ss); err != nil {
			return nil, fmt.Errorf("crun list: decode %q: %v: %w", t, err, errdefs.ErrInternal)
		}
	}
	states := make([]runtime.State, 0, len(ss))
	for _, s := range ss {
		states = append(states, s.state())
	}
	return states, nil
}

// Kill implements runtime.Runtime.
func (c *Crun) Kill(ctx context.Context, id string, sig syscall.Signal, all bool) error {
	if err := validID(id); err != nil {
		return err
	}
	args := []string{"kill"}
	if all {
		args = append(args, "--all")
	}
	_, err := c.command(ctx, id, append(args, id, strconv.Itoa(int(sig)))...)
	return err
}

// Pause implements runtime.Runtime (crun pause: the cgroup freezer).
func (c *Crun) Pause(ctx context.Context, id string) error {
	return c.transition(ctx, id, "pause", runtime.StatusRunning)
}

// Resume implements runtime.Runtime.
func (c *Crun) Resume(ctx context.Context, id string) error {
	return c.transition(ctx, id, "resume", runtime.StatusPaused)
}

func (c *Crun) transition(ctx context.Context, id, verb, want string) error {
	st, err := c.State(ctx, id)
	if err != nil {
		return err
	}
	if st.Status != want {
		return fmt.Errorf("crun %s %s: container is %s, not %s: %w", verb, id, st.Status, want, errdefs.ErrFailedPrecondition)
	}
	_, err = c.command(ctx, id, verb, id)
	return err
}

func isNotFound(err error) bool { return errors.Is(err, errdefs.ErrNotFound) }
