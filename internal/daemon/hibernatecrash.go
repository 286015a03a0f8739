package daemon

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/hostproc"
	"github.com/forkbox/forkbox/internal/runtime/runsc"
	"github.com/forkbox/forkbox/internal/store"
)

// A hibernation cut by the daemon's crash. The runsc CLI that asked for
// the checkpoint dies with the daemon (its parent-death signal), but the
// Sentry it asked goes on saving, and exits once the image is written: the
// complete marker, which the daemon writes after the CLI returns, is never
// written. Without this, reconcile took the sandbox for running, found it
// gone, and cleaned it up, image and files with it.

// savedTimeout bounds reconcile's wait for a save still under way.
var savedTimeout = time.Minute

// savedAfterCrash reports whether the hibernation of sb, recorded under
// way (hibernating) with no complete marker, was finished by its Sentry:
// the image's state file is there and the sandbox has exited, within
// savedTimeout when it was still saving. The image is then marked
// complete. One that is not whole fails the next wake, which says why,
// and the sandbox's files stay either way.
func (d *Daemon) savedAfterCrash(ctx context.Context, sb *store.Sandbox) bool {
	if sb.State != store.StateHibernating {
		return false
	}
	dir := d.hibernateDir(sb.ID)
	img := filepath.Join(dir, runsc.CheckpointImageFile)
	if _, err := os.Stat(img); err != nil {
		return false // the checkpoint never began: the sandbox runs on, or is lost
	}
	rt, ok := d.runtimes[sb.Runtime]
	if !ok {
		return false
	}
	st, err := rt.State(ctx, sb.ID)
	switch {
	case err == nil && alive(st):
		// Still saving, or a save that failed and left it running (or
		// exited, unreaped: runsc says running until its zombie goes):
		// wait for it to exit, boundedly.
		if !hostproc.WaitExited(ctx, st.Pid, savedTimeout) {
			return false
		}
	case err != nil && !errdefs.IsNotFound(err):
		return false
	}
	if fi, err := os.Stat(img); err != nil || fi.Size() == 0 {
		return false
	}
	if err := os.WriteFile(filepath.Join(dir, completeMarker), nil, 0o600); err != nil {
		d.log.Warn("reconcile: mark a hibernation finished after a crash", slog.String("sandbox", sb.ID), slog.Any("err", err))
		return false
	}
	d.log.Warn("reconcile: a hibernation cut by the daemon's crash was finished by the sandbox; its image is taken as whole (a wake will tell)", slog.String("sandbox", sb.ID))
	return true
}
