// Package runsc drives the gVisor runsc binary as a forkbox runtime.Runtime,
// the way containerd's go-runc drives runc: one runsc command per call, with
// forkbox's global flags (state root, platform, overlay, network) in front.
//
// Containers run with --overlay2=none so that sandbox writes land in the
// host rootfs (the snapshotter's upper dir). The sandbox joins the network
// namespace named in the spec (linux.namespaces network path); with
// --network=sandbox gVisor takes over that netns's interfaces and routes.
//
// Do not freeze a running sandbox's host cgroup (the v1 freezer) while it
// works (measured 2026-11-30, the pinned build, systrap, e2e TestLoad with
// 300 execs and 30 filesystem forks from 20 clients): some time after a
// freeze/thaw the sentry's systrap syscall thread of a stub process fails
// SECCOMP_IOCTL_NOTIF_RECV with ENOENT ("failed waiting for seccomp
// notify"), the sentry SIGKILLs that stub ("the subprocess N exited
// (status: 9)"), the sandbox task on it dies with SIGSEGV ("systrap
// corrupted memory: subprocess died"), and when the stub is init's the
// whole sandbox exits, runsc with it. Only frozen sandboxes were hit (2 of
// 4 frozen, 0 of 14 never frozen); with no forks the same exec load passed.
// runsc pause/resume stop it inside the sentry instead (not yet measured
// under this load).
package runsc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/runtime"
	"github.com/forkbox/forkbox/internal/runtime/ocicli"
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
	// Standby is how many runsc processes are kept started ahead for run,
	// create and restore (standby.go); 0: none. Close lets them go.
	Standby int
	// StageDir, when set, is where New mounts a tmpfs of huge pages and
	// copies runsc and its sidecars onto it, to run them from there
	// (stage.go); Close detaches it. When that cannot be done the driver
	// logs why and runs the binary where it is installed.
	StageDir string
	// HideMountsUnder, when set, makes runsc run in a mount namespace of
	// its own without the host's mounts below these directories (the
	// sandboxes' rootfs and netns mounts): a command that starts a
	// sandbox sees that sandbox's alone (view.go). When the view cannot be
	// made the driver logs why and runs runsc in the host's namespace.
	HideMountsUnder []string
	// KeepMountsUnder are more directories whose mounts the view keeps
	// even when they are of a kind it detaches (loop-backed, overlay):
	// the daemon's state and run directories. The driver's own (Root,
	// LogDir, StageDir, the binary's) are kept anyway.
	KeepMountsUnder []string
	// SharedHidden leaves the hidden directories as the host has them,
	// without the private bind of each onto itself (boundary.go) that lets
	// the view follow the host's mounts: the mounts made below them then
	// propagate wherever their parent's do (a Kubernetes node's
	// Bidirectional state volume carries them to the host, where the next
	// pod finds them), and the view is a private copy made at start.
	SharedHidden bool
	Log          *slog.Logger
}

// Runsc is the runsc driver. The zero value is not usable; call New.
type Runsc struct {
	// Tool implements State, List, Kill and the runsc command of Delete.
	ocicli.Tool
	opts    Options
	log     *slog.Logger
	standby *standbyPool // nil without Options.Standby
	stage   *staged      // nil without Options.StageDir, or when staging failed
	view    *view        // nil without Options.HideMountsUnder, or when it could not be made
	closed  atomic.Bool  // set by Close: commands run opts.Binary again
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
	// A runsc that finds the standby variable waits for its command on
	// fd 3 (standby.go): none that this process starts, for any call, may
	// inherit one.
	os.Unsetenv(standbyEnv)
	r := &Runsc{opts: o, log: o.Log.With("runtime", "runsc")}
	if o.StageDir != "" {
		s, err := stageBinaries(context.Background(), o.Binary, o.StageDir)
		if err != nil {
			r.log.Warn("runsc: running the installed binary, not a copy on huge pages", "binary", o.Binary, "err", err)
		} else {
			r.stage = s
			r.log.Info("runsc: running a copy on huge pages", "binary", s.binary, "from", o.Binary)
		}
	}
	if len(o.HideMountsUnder) > 0 {
		// After the stage: its mount is one the view keeps.
		keep := append([]string{o.Root, o.LogDir, o.StageDir, filepath.Dir(o.Binary)}, o.KeepMountsUnder...)
		v, err := newView(o.HideMountsUnder, keep, !o.SharedHidden)
		if err != nil {
			r.log.Warn("runsc: running in the host's mount namespace, among every sandbox's mounts", "err", err)
		} else {
			r.view = v
			if !v.follows && !o.SharedHidden {
				r.log.Warn("runsc: its view is a private copy of the host's mounts, so a file system the host unmounts stays busy until the daemon stops: "+
					"a hidden directory cannot be cut from the host's propagation (mounts below it and no mount point, from sandboxes of an earlier version; "+
					"a mount point in a peer group with another mount, as an earlier version left the netns directory; a bind copied onto another mount); "+
					"a reboot, or `forkbox uninstall` with no sandbox live, clears it", "hidden", v.hidden)
			}
		}
	}
	if o.Standby > 0 {
		var enter func() error
		if r.view != nil {
			enter = r.view.enter
		}
		r.standby = newStandbyPool(r.binary(), o.Standby, r.log, enter)
	}
	// The shared calls write no runsc --log: only run, restore and
	// checkpoint write a per-container one.
	r.Tool = ocicli.Tool{Runtime: "runsc", Command: func(ctx context.Context, id string, args ...string) ([]byte, error) {
		return r.command(ctx, id, args...)
	}}
	return r, nil
}

// Pause implements runtime.Runtime: `runsc pause id` stops every task inside
// the sentry. runsc itself refuses a container that is not running
// ("cannot pause …": FailedPrecondition), so unlike ocicli.Tool.Pause no
// `state` call goes first: this is on a fork's capture path, where every
// runsc invocation costs a static binary's start.
func (r *Runsc) Pause(ctx context.Context, id string) error {
	return r.selfChecked(ctx, "pause", id)
}

// Resume implements runtime.Runtime: `runsc resume id`; runsc refuses a
// container that is not paused ("cannot resume …": FailedPrecondition).
func (r *Runsc) Resume(ctx context.Context, id string) error {
	return r.selfChecked(ctx, "resume", id)
}

func (r *Runsc) selfChecked(ctx context.Context, verb, id string) error {
	if err := ocicli.ValidID("runsc", id); err != nil {
		return err
	}
	_, err := r.command(ctx, id, verb, id)
	return err
}

// Close lets the standby runsc processes go and waits for them (and for
// commands running in them), and detaches the stage of binaries (running
// sandboxes keep theirs). Commands started after it run the installed
// runsc; one that chose the stage's binary just before Close and starts it
// after fails (NotFound): Close comes after the driver's last use.
func (r *Runsc) Close() error {
	r.standby.close()
	verr := r.view.close()
	if r.stage == nil {
		return verr
	}
	r.closed.Store(true)
	return errors.Join(verr, r.stage.unstage(context.Background()))
}

// binary is the runsc that commands run: the stage's copy until Close,
// opts.Binary without one or after it.
func (r *Runsc) binary() string {
	if r.stage != nil && !r.closed.Load() {
		return r.stage.binary
	}
	return r.opts.Binary
}

// StandbyStats reports the standby runsc processes (zero without them).
func (r *Runsc) StandbyStats() StandbyStats { return r.standby.stats() }

// Name implements runtime.Runtime.
func (r *Runsc) Name() string { return "runsc" }

// Root returns the directory of the driver's state roots (see roots.go).
func (r *Runsc) Root() string { return r.opts.Root }

// globalArgs returns the flags in front of every runsc command: root is the
// container's state root, logID names its runsc log ("" for none).
func (r *Runsc) globalArgs(root, logID string) []string {
	a := []string{
		"--root", root,
		// State shared across sandboxes (the "null" gofer netns) stays
		// in the root of roots.
		"--shared-root", r.opts.Root,
		"--platform", r.opts.Platform,
		"--overlay2", r.opts.Overlay,
		"--network", r.opts.Network,
		"--gofer-network-namespace", r.opts.GoferNetNS,
	}
	if r.opts.FileAccess != "" {
		a = append(a, "--file-access", r.opts.FileAccess)
	}
	if p := r.logFile(logID); p != "" && logID != "" {
		a = append(a, "--log", p)
	}
	return append(a, r.opts.ExtraFlags...)
}

// command runs runsc in the state root of container id (Root for "") with
// the global flags and args, and returns stdout.
func (r *Runsc) command(ctx context.Context, id string, args ...string) ([]byte, error) {
	return r.runIn(ctx, r.RootOf(id), "", args...)
}

// runIn runs runsc in state root root, with its log for logID when set.
// On failure the error carries runsc's stderr, classified by errs.
func (r *Runsc) runIn(ctx context.Context, root, logID string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, r.binary(), append(r.globalArgs(root, logID), args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.WaitDelay = 5 * time.Second
	if err := r.view.do(cmd.Run); err != nil {
		return nil, r.wrap(ctx, args[0], logID, err, stderr.String())
	}
	return stdout.Bytes(), nil
}

// errs classifies runsc's messages. Unlike crun, runsc's NotFound rule
// comes before AlreadyExists (kept as it was), and runsc words an illegal
// transition its own way.
var errs = ocicli.Errors{Runtime: "runsc", Rules: []ocicli.Rule{
	ocicli.NotFound,
	ocicli.AlreadyExists,
	ocicli.Precondition("cannot pause", "cannot resume", "cannot checkpoint", "invalid state", "is in state"),
}}

// wrap turns a failed runsc command into an error of the right class.
func (r *Runsc) wrap(ctx context.Context, verb, id string, err error, stderr string) error {
	return errs.Wrap(ctx, verb, id, err, stderr)
}

func validID(id string) error { return ocicli.ValidID("runsc", id) }

// HostPidsLimit is the host pids cgroup limit for a sandbox whose tenant
// may have pids tasks. The host cgroup counts the runtime's own tasks too:
// the sentry's and the gofer's threads (about 20 idle, more under load) and,
// with the systrap platform, stub processes and threads for the sandbox's
// address spaces and threads, about two host tasks per sandbox task
// (measured: 84 sandbox processes, 191 host tasks). A host limit equal to
// the tenant's kills the sandbox (its sentry cannot make a thread) instead
// of refusing the tenant's fork. So the tenant's limit is enforced inside
// the sandbox (the agent gives every process it starts RLIMIT_NPROC, which
// the sentry enforces with EAGAIN) and the host limit leaves room for the
// runtime: twice the tenant's plus 256. 0 (no limit) stays 0.
func HostPidsLimit(pids int64) int64 {
	if pids <= 0 {
		return 0
	}
	return 2*pids + 256
}
