// Run and Delete: the two runsc calls that create and remove host state
// (sandbox and gofer processes, cgroups, the state-root entry).

package runsc

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/cgroups"
	"github.com/forkbox/forkbox/internal/runtime/ocicli"
	"github.com/forkbox/forkbox/internal/runtime/spec"
)

// Run implements runtime.Runtime: `runsc run --detach`, with the init's
// stdio on bundle/stdio.log and stdin on /dev/null. No pipe is handed to
// runsc, so nothing blocks once the runsc CLI exits. On failure everything
// runsc created is deleted again.
func (r *Runsc) Run(ctx context.Context, id, bundle string) error {
	// A missing path the spec names (args[0], a mount source) is the
	// caller's input, not an unknown container.
	return r.detached(ctx, "run", id, bundle, errdefs.ErrInvalidArgument)
}

// detached runs `runsc VERB --detach [extra...] --bundle bundle id` (create:
// without --detach) for a container runsc does not know yet, in a state root
// of its own.
func (r *Runsc) detached(ctx context.Context, verb, id, bundle string, missingClass error, extra ...string) error {
	if err := ocicli.CheckNew(ctx, r.State, "runsc", verb, id, bundle); err != nil {
		return err
	}
	root, err := r.makeRoot(id, bundle)
	if err != nil {
		return fmt.Errorf("runsc %s %s: %w", verb, id, err)
	}
	args := []string{verb}
	if verb != "create" { // create has no --detach: it never waits
		args = append(args, "--detach")
	}
	args = append(append(args, extra...), "--bundle", bundle, id)
	return r.cli(ctx, verb, id, bundle, root, missingClass, args)
}

// cli runs one runsc command that leaves processes behind (run, create,
// restore) with its stdio on bundle/stdio.log, in a standby runsc when one
// is ready (standby.go), and deletes container id if it fails (unless runsc
// refused a restore for the container's state). A NotFound from runsc
// becomes missingClass.
func (r *Runsc) cli(ctx context.Context, verb, id, bundle, root string, missingClass error, verbArgs []string) error {
	stdio, err := ocicli.OpenStdio(bundle)
	if err != nil {
		return fmt.Errorf("runsc %s %s: %w", verb, id, err)
	}
	defer stdio.Close()
	s, err := spec.ReadBundle(bundle)
	if err != nil {
		return fmt.Errorf("runsc %s %s: %w", verb, id, err)
	}
	release, err := r.view.attach(bundleMounts(bundle, s))
	if err != nil {
		return fmt.Errorf("runsc %s %s: %w", verb, id, err)
	}
	defer release()
	t0 := time.Now()
	logAt := logSize(r.logFile(id))
	args := append(r.globalArgs(root, id), verbArgs...)
	standby, runErr := r.standby.run(ctx, args, stdio.Null, stdio.Log, stdio.Log)
	if !standby {
		runErr = r.startCLI(ctx, args, stdio)
	}
	if runErr != nil {
		msg := shortLines(ocicli.ReadFrom(stdio.LogPath, stdio.Start), 400)
		if cause := logCause(r.logFile(id), logAt, msg); cause != "" {
			// Classed with runsc's own words: a bind source that is gone
			// is missingClass, not Internal.
			msg = strings.TrimRight(msg, "\n") + "\nrunsc's log: " + cause
		}
		if verb == "restore" && strings.Contains(msg, fmt.Sprintf("cannot restore container %q in state ", id)) {
			// A restore into a container that is not created (started or
			// restored already: RestoreCreated): refused before anything
			// was done, and the container is not this call's to delete.
			return fmt.Errorf("runsc %s %s: %s: %w", verb, id, ocicli.LastLines(msg, 1), errdefs.ErrFailedPrecondition)
		}
		ocicli.CleanupFailed(ctx, r.log, r.Delete, verb, id)
		r.removeCgroup(ctx, verb, id, s)
		if strings.Contains(msg, "runsc version does not match across checkpoint restore") {
			return fmt.Errorf("runsc %s %s: the image was saved by another runsc build: %s: %w", verb, id, ocicli.LastLines(msg, 1), errdefs.ErrFailedPrecondition)
		}
		if strings.Contains(msg, "does not match across checkpoint restore") {
			// runsc's restore spec validation: Args, Cwd and the mount
			// list (destination, type, options) must equal the source's.
			return fmt.Errorf("runsc %s %s: spec differs from the checkpointed one: %s: %w", verb, id, ocicli.LastLines(msg, 2), errdefs.ErrFailedPrecondition)
		}
		return ocicli.Reclass(r.wrap(ctx, verb, id, runErr, msg), errdefs.ErrNotFound, missingClass)
	}
	r.log.Debug("container "+map[string]string{"run": "running", "create": "created", "restore": "restored"}[verb], "sandbox", id, "took", time.Since(t0), "standby", standby)
	return nil
}

// removeCgroup removes the cgroup that spec s names after a failed verb:
// a sandbox that died as it started leaves the one runsc made for it, and
// runsc's delete, which no longer knows the container, does not remove it.
// A tenant container (pod.go) names none: its sandbox's is not its own.
func (r *Runsc) removeCgroup(ctx context.Context, verb, id string, s *specs.Spec) {
	if s.Linux == nil || !strings.HasPrefix(s.Linux.CgroupsPath, "/") || strings.Contains(s.Linux.CgroupsPath, ":") {
		return
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if err := cgroups.Remove(cctx, s.Linux.CgroupsPath); err != nil {
		r.log.Warn("cleanup after failed "+verb, "sandbox", id, "err", err)
	}
}

// startCLI runs runsc with args and stdio, and waits for it.
func (r *Runsc) startCLI(ctx context.Context, args []string, stdio *ocicli.Stdio) error {
	cmd := exec.CommandContext(ctx, r.binary(), args...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdio.Null, stdio.Log, stdio.Log
	// Own process group: a terminal's ^C to the daemon must not reach the
	// sandbox processes runsc leaves behind.
	// Pdeathsig: a daemon killed mid-call takes the CLI with it, so no
	// `runsc restore` or `run` goes on creating the container behind the
	// restarted daemon's reconcile (which deletes what it left).
	// The kernel sends Pdeathsig when the *thread* that forked the CLI
	// exits, not the process: a Go thread that another goroutine later
	// locks and ends (the crun driver ends the threads it unshares) would
	// SIGKILL a `runsc run` half-way ("signal: killed", the load test's
	// failed creates). The thread that forks it (view.do) stays until the
	// CLI is done, so only the daemon's death sends the signal.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.WaitDelay = 5 * time.Second
	return r.view.do(cmd.Run)
}

// shortLines cuts every line of s to at most n bytes (runsc's spec
// validation errors print whole mount lists on one line).
func shortLines(s string, n int) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		if len(l) > n {
			lines[i] = l[:n] + "…"
		}
	}
	return strings.Join(lines, "\n")
}

// Delete implements runtime.Runtime: `runsc delete [--force]`. An unknown id
// is not an error. runsc removes the sandbox's cgroups and state entry and
// reaps its sandbox and gofer processes. A tenant whose pod (pod.go) went
// first fails runsc's delete ("no control socket found for sandbox"), but
// its state goes with the failure: that is deleted, once runsc no longer
// knows it.
func (r *Runsc) Delete(ctx context.Context, id string, force bool) error {
	t0 := time.Now()
	err := r.Tool.Delete(ctx, id, force)
	if err != nil && !errdefs.IsNotFound(err) && !force {
		// runsc-only: it refuses to delete a running container without
		// --force in words the shared rules do not class as FailedPrecondition.
		if m := strings.ToLower(err.Error()); strings.Contains(m, "running") || strings.Contains(m, "not stopped") {
			return fmt.Errorf("%v: %w", err, errdefs.ErrFailedPrecondition)
		}
	}
	if err != nil {
		if !strings.Contains(err.Error(), "no control socket found") {
			return err
		}
		if _, serr := r.State(ctx, id); !errdefs.IsNotFound(serr) {
			return err
		}
		r.log.Warn("runsc delete failed, but runsc no longer knows the container", "sandbox", id, "err", err)
	}
	r.forgetRoot(id)
	r.log.Debug("container deleted", "sandbox", id, "took", time.Since(t0))
	return nil
}
