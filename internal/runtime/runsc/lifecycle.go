// Run and Delete: the two runsc calls that create and remove host state
// (sandbox and gofer processes, cgroups, the state-root entry).

package runsc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/runtime"
)

// Run implements runtime.Runtime: `runsc run --detach`, with the init's
// stdio on bundle/stdio.log and stdin on /dev/null. No pipe is handed to
// runsc, so nothing blocks once the runsc CLI exits. On failure everything
// runsc created is deleted again.
func (r *Runsc) Run(ctx context.Context, id, bundle string) (err error) {
	if err := validID(id); err != nil {
		return err
	}
	if !filepath.IsAbs(bundle) {
		return fmt.Errorf("runsc run %s: bundle %q must be absolute: %w", id, bundle, errdefs.ErrInvalidArgument)
	}
	if _, err := os.Stat(filepath.Join(bundle, "config.json")); err != nil {
		return fmt.Errorf("runsc run %s: bundle %s: %v: %w", id, bundle, err, errdefs.ErrNotFound)
	}
	if _, err := r.State(ctx, id); err == nil {
		return fmt.Errorf("runsc run %s: container exists: %w", id, errdefs.ErrAlreadyExists)
	} else if !isNotFound(err) {
		return err
	}

	logPath := filepath.Join(bundle, runtime.LogFileName)
	logf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("runsc run %s: open log: %v: %w", id, err, errdefs.ErrInternal)
	}
	defer logf.Close()
	start, _ := logf.Seek(0, io.SeekEnd)
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return fmt.Errorf("runsc run %s: %v: %w", id, err, errdefs.ErrInternal)
	}
	defer devnull.Close()

	t0 := time.Now()
	cmd := exec.CommandContext(ctx, r.opts.Binary,
		append(r.globalArgs(id), "run", "--detach", "--bundle", bundle, id)...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = devnull, logf, logf
	// Own process group: a terminal's ^C to the daemon must not reach the
	// sandbox processes runsc leaves behind.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.WaitDelay = 5 * time.Second
	if runErr := cmd.Run(); runErr != nil {
		msg := readFrom(logPath, start)
		// Use a fresh context: the caller's may be the reason we failed.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if derr := r.Delete(cctx, id, true); derr != nil {
			r.log.Warn("cleanup after failed run", "sandbox", id, "err", derr)
		}
		err := r.wrap(ctx, "run", id, runErr, msg)
		if errors.Is(err, errdefs.ErrNotFound) {
			// Something the spec names is missing (args[0], a mount source):
			// the caller's input, not an unknown container.
			err = fmt.Errorf("%s: %w", strings.TrimSuffix(err.Error(), ": "+errdefs.ErrNotFound.Error()), errdefs.ErrInvalidArgument)
		}
		return err
	}
	r.log.Debug("container running", "sandbox", id, "took", time.Since(t0))
	return nil
}

// readFrom returns what was appended to path after offset (at most 4 KiB
// from the end).
func readFrom(path string, off int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return ""
	}
	if fi.Size()-off > 4096 {
		off = fi.Size() - 4096
	}
	b := make([]byte, fi.Size()-off)
	n, _ := f.ReadAt(b, off)
	return string(b[:n])
}

// Delete implements runtime.Runtime: `runsc delete [--force]`. An unknown id
// is not an error. runsc removes the sandbox's cgroups and state entry and
// reaps its sandbox and gofer processes.
func (r *Runsc) Delete(ctx context.Context, id string, force bool) error {
	if err := validID(id); err != nil {
		return err
	}
	args := []string{"delete"}
	if force {
		args = append(args, "--force")
	}
	t0 := time.Now()
	_, err := r.command(ctx, "", append(args, id)...)
	if err != nil && isNotFound(err) {
		// runsc says "does not exist" both for unknown ids and for some
		// half-created ones; make sure no state entry is left behind.
		if _, serr := r.State(ctx, id); serr == nil {
			return err
		}
		return nil
	}
	if err != nil && !force && (strings.Contains(strings.ToLower(err.Error()), "running") || strings.Contains(strings.ToLower(err.Error()), "not stopped")) {
		return fmt.Errorf("%v: %w", err, errdefs.ErrFailedPrecondition)
	}
	if err != nil {
		return err
	}
	r.log.Debug("container deleted", "sandbox", id, "took", time.Since(t0))
	return nil
}
