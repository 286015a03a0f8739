// Package runsc drives the gVisor runsc binary as a forkbox runtime.Runtime,
// the way containerd's go-runc drives runc: one runsc command per call, with
// forkbox's global flags (state root, platform, overlay, network) in front.
//
// Containers run with --overlay2=none so that sandbox writes land in the
// host rootfs (the snapshotter's upper dir). The sandbox joins the network
// namespace named in the spec (linux.namespaces network path); with
// --network=sandbox gVisor takes over that netns's interfaces and routes.
package runsc

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/runtime"
)

// Options configure the runsc driver. Zero values take the defaults noted.
type Options struct {
	Binary     string // default "runsc" from PATH
	Root       string // state root; default /run/forkbox/runsc
	LogDir     string // runsc's own logs (one file per container); empty = none
	Platform   string // default "systrap"
	Overlay    string // --overlay2 value; default "none" (required by forkbox snapshots)
	Network    string // default "sandbox"
	FileAccess string // --file-access for the rootfs; default runsc's ("exclusive")
	// GoferNetNS is --gofer-network-namespace; default "new" (one empty netns
	// per gofer). runsc's own default, "null", pins a shared empty netns as a
	// bind mount at Root/null-netns that outlives every container.
	GoferNetNS string
	ExtraFlags []string // more global flags, placed before the subcommand
	Log        *slog.Logger
}

// Runsc is the runsc driver. The zero value is not usable; call New.
type Runsc struct {
	opts Options
	log  *slog.Logger
}

var _ runtime.Runtime = (*Runsc)(nil)

// New returns a driver with o's defaults filled in. It checks that the binary
// exists (Unavailable if not) and creates the state root.
func New(o Options) (*Runsc, error) {
	if o.Binary == "" {
		o.Binary = "runsc"
	}
	bin, err := exec.LookPath(o.Binary)
	if err != nil {
		return nil, fmt.Errorf("runsc: binary %q: %v: %w", o.Binary, err, errdefs.ErrUnavailable)
	}
	o.Binary = bin
	if o.Root == "" {
		o.Root = "/run/forkbox/runsc"
	}
	if o.Platform == "" {
		o.Platform = "systrap"
	}
	if o.Overlay == "" {
		o.Overlay = "none"
	}
	if o.Network == "" {
		o.Network = "sandbox"
	}
	if o.GoferNetNS == "" {
		o.GoferNetNS = "new"
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	for _, d := range []string{o.Root, o.LogDir} {
		if d == "" {
			continue
		}
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("runsc: %v: %w", err, errdefs.ErrInternal)
		}
	}
	return &Runsc{opts: o, log: o.Log.With("runtime", "runsc")}, nil
}

// Name implements runtime.Runtime.
func (r *Runsc) Name() string { return "runsc" }

// Root returns the state root the driver passes to runsc.
func (r *Runsc) Root() string { return r.opts.Root }

func (r *Runsc) globalArgs(id string) []string {
	a := []string{
		"--root", r.opts.Root,
		"--platform", r.opts.Platform,
		"--overlay2", r.opts.Overlay,
		"--network", r.opts.Network,
		"--gofer-network-namespace", r.opts.GoferNetNS,
	}
	if r.opts.FileAccess != "" {
		a = append(a, "--file-access", r.opts.FileAccess)
	}
	if r.opts.LogDir != "" && id != "" {
		a = append(a, "--log", filepath.Join(r.opts.LogDir, id+".log"))
	}
	return append(a, r.opts.ExtraFlags...)
}

// command runs runsc with the global flags and args, and returns stdout. On
// failure the error carries runsc's stderr, classified by classify.
func (r *Runsc) command(ctx context.Context, id string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, r.opts.Binary, append(r.globalArgs(id), args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Run(); err != nil {
		return nil, r.wrap(ctx, args[0], id, err, stderr.String())
	}
	return stdout.Bytes(), nil
}

// wrap turns a failed runsc command into an error of the right class.
func (r *Runsc) wrap(ctx context.Context, verb, id string, err error, stderr string) error {
	if ctx.Err() != nil {
		return fmt.Errorf("runsc %s %s: %w", verb, id, ctx.Err())
	}
	msg := strings.TrimSpace(stderr)
	if msg == "" {
		msg = err.Error()
	}
	return fmt.Errorf("runsc %s %s: %s: %w", verb, id, lastLines(msg, 5), classify(msg))
}

func classify(msg string) error {
	m := strings.ToLower(msg)
	switch {
	case strings.Contains(m, "does not exist") || strings.Contains(m, "no such file") || strings.Contains(m, "not found"):
		return errdefs.ErrNotFound
	case strings.Contains(m, "already exists"):
		return errdefs.ErrAlreadyExists
	case strings.Contains(m, "not running") || strings.Contains(m, "not paused") ||
		strings.Contains(m, "cannot pause") || strings.Contains(m, "cannot resume") ||
		strings.Contains(m, "invalid state") || strings.Contains(m, "is in state"):
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

// validID rejects ids runsc would refuse or that could escape the root.
func validID(id string) error {
	if id == "" || len(id) > 128 || strings.ContainsAny(id, "/\\ \t\n\x00") || id == "." || id == ".." {
		return fmt.Errorf("runsc: container id %q is not valid: %w", id, errdefs.ErrInvalidArgument)
	}
	return nil
}

// ociState is `runsc state` / `runsc list --format json` output.
type ociState struct {
	ID     string `json:"id"`
	Pid    int    `json:"pid"`
	Status string `json:"status"`
	Bundle string `json:"bundle"`
}

func (s ociState) state() runtime.State {
	return runtime.State{ID: s.ID, Status: s.Status, Pid: s.Pid, Bundle: s.Bundle}
}

// State implements runtime.Runtime.
func (r *Runsc) State(ctx context.Context, id string) (runtime.State, error) {
	if err := validID(id); err != nil {
		return runtime.State{}, err
	}
	out, err := r.command(ctx, "", "state", id)
	if err != nil {
		return runtime.State{}, err
	}
	var s ociState
	if err := json.Unmarshal(out, &s); err != nil {
		return runtime.State{}, fmt.Errorf("runsc state %s: decode %q: %v: %w", id, out, err, errdefs.ErrInternal)
	}
	return s.state(), nil
}

// List implements runtime.Runtime.
func (r *Runsc) List(ctx context.Context) ([]runtime.State, error) {
	out, err := r.command(ctx, "", "list", "--format", "json")
	if err != nil {
		return nil, err
	}
	var ss []ociState
	if t := bytes.TrimSpace(out); len(t) > 0 && !bytes.Equal(t, []byte("null")) {
		if err := json.Unmarshal(t, &ss); err != nil {
			return nil, fmt.Errorf("runsc list: decode: %v: %w", err, errdefs.ErrInternal)
		}
	}
	states := make([]runtime.State, 0, len(ss))
	for _, s := range ss {
		states = append(states, s.state())
	}
	return states, nil
}

// Kill implements runtime.Runtime.
func (r *Runsc) Kill(ctx context.Context, id string, sig syscall.Signal, all bool) error {
	if err := validID(id); err != nil {
		return err
	}
	args := []string{"kill"}
	if all {
		args = append(args, "--all")
	}
	_, err := r.command(ctx, "", append(args, id, strconv.Itoa(int(sig)))...)
	return err
}

// Pause implements runtime.Runtime.
func (r *Runsc) Pause(ctx context.Context, id string) error {
	return r.transition(ctx, id, "pause", runtime.StatusRunning)
}

// Resume implements runtime.Runtime.
func (r *Runsc) Resume(ctx context.Context, id string) error {
	return r.transition(ctx, id, "resume", runtime.StatusPaused)
}

func (r *Runsc) transition(ctx context.Context, id, verb, want string) error {
	st, err := r.State(ctx, id)
	if err != nil {
		return err
	}
	if st.Status != want {
		return fmt.Errorf("runsc %s %s: container is %s, not %s: %w", verb, id, st.Status, want, errdefs.ErrFailedPrecondition)
	}
	_, err = r.command(ctx, "", verb, id)
	return err
}

// isNotFound reports whether err is runsc saying the container is unknown.
func isNotFound(err error) bool { return errors.Is(err, errdefs.ErrNotFound) }
