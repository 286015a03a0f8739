package daemon

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/hostproc"
	"github.com/forkbox/forkbox/internal/runtime"
	"github.com/forkbox/forkbox/internal/store"
)

// A sandbox whose runtime died under a running daemon (its processes
// killed, or the host's OOM killer): nothing else notices until a restart,
// and until then it stayed "running" while every exec timed out on its
// agent, and resume refused it as live. An exec that finds the agent
// unreachable asks the runtime; a dead sandbox is recorded failed, with
// why, and the exec's error says what to do.

// diedReason is why a sandbox found dead under an exec is failed.
const diedReason = "its runtime's processes are gone (killed, or out of host memory)"

// diedUnder returns err, an exec's on sb whose agent was unreachable, or,
// when sb's runtime has died, records sb failed and returns an error of
// class FailedPrecondition that says so.
func (d *Daemon) diedUnder(ctx context.Context, sb *store.Sandbox, err error) error {
	if !errdefs.IsUnavailable(err) || !d.runtimeDied(ctx, sb) {
		return err
	}
	if serr := d.setStateNoting(context.WithoutCancel(ctx), sb, store.StateFailed, diedReason, store.EventSandboxLost,
		map[string]any{"reason": diedReason}); serr != nil {
		d.log.Warn("record a dead sandbox failed", slog.String("sandbox", sb.ID), slog.Any("err", serr))
	}
	return fmt.Errorf("sandbox %s died: %s; resume it (forkbox resume %s) or close it (%v): %w",
		sb.ID, diedReason, sb.ID, err, errdefs.ErrFailedPrecondition)
}

// runtimeDied reports whether sb's runtime says its container is gone.
func (d *Daemon) runtimeDied(ctx context.Context, sb *store.Sandbox) bool {
	rt, ok := d.runtimes[sb.Runtime]
	if !ok {
		return false
	}
	return gone(rt.State(ctx, sb.ID))
}

// gone reports whether a runtime's State of a container says it is gone:
// unknown to the runtime, stopped, or its host process exited (runsc
// reports a sandbox as its state file last said, paused say, while its
// process is gone or an unreaped zombie). An error other than NotFound
// says nothing.
func gone(st runtime.State, err error) bool {
	if err != nil {
		return errdefs.IsNotFound(err)
	}
	return !alive(st) || (st.Pid > 0 && hostproc.Exited(st.Pid))
}
