// Run and Delete: the two crun calls that create and remove host state
// (the init process, cgroups, the state-root entry).

package crun

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/runtime"
)

// PidFileName is the file in the bundle dir where crun writes the init's
// host pid.
const PidFileName = "init.pid"

// Run implements runtime.Runtime: `crun run --detach`, with the init's stdio
// on bundle/stdio.log and stdin on /dev/null. No pipe is handed to crun, so
// nothing blocks once the crun CLI exits. On failure everything crun created
// is deleted again.
func (c *Crun) Run(ctx context.Context, id, bundle string) (err error) {
	if err := validID(id); err != nil {
		return err
	}
	if !filepath.IsAbs(bundle) {
		return fmt.Errorf("crun run %s: bundle %q must be absolute: %w", id, bundle, errdefs.ErrInvalidArgument)
	}
	if _, err := os.Stat(filepath.Join(bundle, "config.json")); err != nil {
		return fmt.Errorf("crun run %s: bundle %s: %v: %w", id, bundle, err, errdefs.ErrNotFound)
	}
	if _, err := c.State(ctx, id); err == nil {
		return fmt.Errorf("crun run %s: container exists: %w", id, errdefs.ErrAlreadyExists)
	} else if !isNotFound(err) {
		return err
	}

	logPath := filepath.Join(bundle, runtime.LogFileName)
	logf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("crun run %s: open log: %v: %w", id, err, errdefs.ErrInternal)
	}
	defer logf.Close()
	start, _ := logf.Seek(0, io.SeekEnd)
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return fmt.Errorf("crun run %s: %v: %w", id, err, errdefs.ErrInternal)
	}
	defer devnull.Close()

	// crun writes its own errors to --log instead of stderr when given one.
	var global []string
	errPath, errStart := logPath, start
	if c.opts.LogDir != "" {
		errPath = filepath.Join(c.opts.LogDir, id+".log")
		global = []string{"--log", errPath}
		if fi, err := os.Stat(errPath); err == nil {
			errStart = fi.Size()
		} else {
			errStart = 0
		}
	}

	t0 := time.Now()
	cmd := c.cmd(ctx, global, "run", "--detach", "--bundle", bundle, "--pid-file", filepath.Join(bundle, PidFileName), id)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = devnull, logf, logf
	// Own process group: a terminal's ^C to the daemon must not reach the
	// container init crun leaves behind.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	runErr := c.start(cmd)
	if runErr == nil {
		runErr = cmd.Wait()
	}
	if runErr != nil {
		msg := readFrom(errPath, errStart)
		// Use a fresh context: the caller's may be the reason we failed.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if derr := c.Delete(cctx, id, true); derr != nil {
			c.log.Warn("cleanup after failed run", "sandbox", id, "err", derr)
		}
		err := c.wrap(ctx, "run", id, runErr, msg)
		if errors.Is(err, errdefs.ErrNotFound) {
			// Something the spec names is missing (args[0], a mount source):
			// the caller's input, not an unknown container.
			err = fmt.Errorf("%s: %w", strings.TrimSuffix(err.Error(), ": "+errdefs.ErrNotFound.Error()), errdefs.ErrInvalidArgument)
		}
		return err
	}
	c.log.Debug("container running", "sandbox", id, "took", time.Since(t0))
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
	if err != nil || fi.Size() < off {
		return ""
	}
	if fi.Size()-off > 4096 {
		off = fi.Size() - 4096
	}
	b := make([]byte, fi.Size()-off)
	n, _ := f.ReadAt(b, off)
	return string(b[:n])
}

// Delete implements runtime.Runtime: `crun delete [--force]`. An unknown id
// is not an error. crun removes the container's cgroups and state entry;
// with force it first SIGKILLs every process in the cgroup. The init
// (reparented to the host's init when crun exited) is reaped by the host.
func (c *Crun) Delete(ctx context.Context, id string, force bool) error {
	if err := validID(id); err != nil {
		return err
	}
	args := []string{"delete"}
	if force {
		args = append(args, "--force")
	}
	t0 := time.Now()
	_, err := c.command(ctx, id, append(args, id)...)
	if err != nil && isNotFound(err) {
		// Unknown id. Make sure no state entry is left behind by a
		// half-created container either.
		if _, serr := c.State(ctx, id); serr == nil {
			return err
		}
		os.RemoveAll(filepath.Join(c.opts.Root, id)) // crun's own dir, if only partly written
		return nil
	}
	if err != nil {
		return err
	}
	c.log.Debug("container deleted", "sandbox", id, "took", time.Since(t0))
	return nil
}
