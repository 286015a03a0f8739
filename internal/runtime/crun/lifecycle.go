// Run and Delete: the two crun calls that create and remove host state
// (the init process, cgroups, the state-root entry).

package crun

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/runtime/ocicli"
)

// PidFileName is the file in the bundle dir where crun writes the init's
// host pid.
const PidFileName = "init.pid"

// Run implements runtime.Runtime: `crun run --detach`, with the init's stdio
// on bundle/stdio.log and stdin on /dev/null. No pipe is handed to crun, so
// nothing blocks once the crun CLI exits. On failure everything crun created
// is deleted again.
func (c *Crun) Run(ctx context.Context, id, bundle string) (err error) {
	if err := ocicli.CheckNew(ctx, c.State, "crun", "run", id, bundle); err != nil {
		return err
	}
	stdio, err := ocicli.OpenStdio(bundle)
	if err != nil {
		return fmt.Errorf("crun run %s: %w", id, err)
	}
	defer stdio.Close()

	// crun writes its own errors to --log instead of stderr when given one.
	var global []string
	errPath, errStart := stdio.LogPath, stdio.Start
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
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdio.Null, stdio.Log, stdio.Log
	// Own process group: a terminal's ^C to the daemon must not reach the
	// container init crun leaves behind.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	runErr := c.start(cmd)
	if runErr == nil {
		runErr = cmd.Wait()
	}
	if runErr != nil {
		msg := ocicli.ReadFrom(errPath, errStart)
		ocicli.CleanupFailed(ctx, c.log, c.Delete, "run", id)
		// NotFound here is something the spec names (args[0], a mount
		// source): the caller's input, not an unknown container.
		return ocicli.Reclass(c.wrap(ctx, "run", id, runErr, msg), errdefs.ErrNotFound, errdefs.ErrInvalidArgument)
	}
	c.log.Debug("container running", "sandbox", id, "took", time.Since(t0))
	return nil
}

// Delete implements runtime.Runtime: `crun delete [--force]`. An unknown id
// is not an error. crun removes the container's cgroups and state entry;
// with force it first SIGKILLs every process in the cgroup. The init
// (reparented to the host's init when crun exited) is reaped by the host.
func (c *Crun) Delete(ctx context.Context, id string, force bool) error {
	t0 := time.Now()
	if err := c.Tool.Delete(ctx, id, force); err != nil {
		return err
	}
	c.log.Debug("container deleted", "sandbox", id, "took", time.Since(t0))
	return nil
}
