// How a sandbox's processes are stopped in place (for a pause, or the
// instant of a filesystem capture) and started again, per runtime.

package daemon

import (
	"context"
	"fmt"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/runtime"
	"github.com/forkbox/forkbox/internal/store"
)

// stopsInside reports whether a sandbox's runtime stops it with its own
// kernel rather than the host's cgroup freezer. gVisor does (runsc
// pause/resume stop every task inside the sentry): freezing a running
// gVisor sandbox's host cgroup under the systrap platform interrupts the
// sentry's seccomp notifications to its stub processes, and after the thaw
// a stub can be lost with the tasks on it (execs die with SIGSEGV or
// SIGKILL, and the whole sandbox when the agent's stub goes; found by the
// load run, see internal/runtime/runsc). crun's processes are ordinary
// host processes: the freezer stops them exactly.
func stopsInside(sb *store.Sandbox) bool { return sb.Runtime == RuntimeGVisor }

// suspendTimeout bounds one stop or start in place. Neither is cut short
// by a caller that goes away: runsc makes the sentry's call before it saves
// its state file, and a cut between the two would leave them disagreeing
// (a sentry stopped while the file says running cannot be resumed through
// runsc, and a resume without a matching pause panics the sentry).
const suspendTimeout = 30 * time.Second

// suspend stops every process of a running sandbox in place (memory kept).
// The caller holds the sandbox's lock. When the runtime's call fails, its
// state is read back: a gVisor sandbox that runsc reports paused is paused,
// as asked.
func (d *Daemon) suspend(ctx context.Context, sb *store.Sandbox) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), suspendTimeout)
	defer cancel()
	if !stopsInside(sb) {
		return d.host.Freeze(ctx, d.cgroupPath(sb.ID))
	}
	rt, err := d.runtimeOf(sb)
	if err != nil {
		return err
	}
	return d.settle(ctx, rt, sb, rt.Pause(ctx, sb.ID), runtime.StatusPaused)
}

// unsuspend starts a suspended sandbox's processes again; like suspend, a
// gVisor sandbox that runsc reports running after a failed call is running.
func (d *Daemon) unsuspend(ctx context.Context, sb *store.Sandbox) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), suspendTimeout)
	defer cancel()
	if !stopsInside(sb) {
		return d.host.Thaw(ctx, d.cgroupPath(sb.ID))
	}
	rt, err := d.runtimeOf(sb)
	if err != nil {
		return err
	}
	return d.settle(ctx, rt, sb, rt.Resume(ctx, sb.ID), runtime.StatusRunning)
}

// settle returns err unless the runtime reports the sandbox in the state the
// failed call was to reach (its CLI saved it, then failed or was killed).
func (d *Daemon) settle(ctx context.Context, rt runtime.Runtime, sb *store.Sandbox, err error, want string) error {
	if err == nil {
		return nil
	}
	if st, serr := rt.State(ctx, sb.ID); serr == nil && st.Status == want {
		d.log.Warn("runtime call failed but reached its state", "sandbox", sb.ID, "state", want, "err", err)
		return nil
	}
	return err
}

// isSuspended reports whether a live container (st, as its runtime reports
// it) is suspended: for gVisor its runtime's word, for the others the
// freezer's. A gVisor sandbox's host cgroup is thawed here if an earlier
// daemon froze it (the freezer was how every runtime paused before).
func (d *Daemon) isSuspended(ctx context.Context, sb *store.Sandbox, st runtime.State) (bool, error) {
	cg := d.cgroupPath(sb.ID)
	frozen, err := d.host.Frozen(cg)
	if err != nil {
		return false, err
	}
	if !stopsInside(sb) {
		return frozen, nil
	}
	if frozen {
		if err := d.host.Thaw(ctx, cg); err != nil {
			return false, err
		}
	}
	return st.Status == runtime.StatusPaused, nil
}

// runtimeOf returns the driver of a sandbox's runtime.
func (d *Daemon) runtimeOf(sb *store.Sandbox) (runtime.Runtime, error) {
	rt, ok := d.runtimes[sb.Runtime]
	if !ok {
		return nil, fmt.Errorf("sandbox %s: its runtime %s is not available on this daemon: %w", sb.ID, sb.Runtime, errdefs.ErrUnavailable)
	}
	return rt, nil
}
