package daemon

import (
	"context"
	"log/slog"

	"github.com/forkbox/forkbox/internal/runtime/spec"
	"github.com/forkbox/forkbox/internal/store"
)

// A gVisor sandbox starts with its CPU limit accounted over
// spec.CPUStartPeriod, a second, and gets spec.CPUPeriod back once it is
// up: the same share of the CPU either way. Its Sentry's boot, and above
// all a restore (pages loaded, kernel state decoded and garbage collected
// on several threads at once), used more than a 100 ms period's quota of
// one CPU within one period and were throttled in the middle of the start:
// 9 of 20 memory-fork children here, for up to 49 ms. crun, whose start
// runs one process in the cgroup, keeps CPUPeriod.
//
// The period is set back by every start that ends with a running gVisor
// sandbox (create, fork children, memory-fork children, a wake, a memory
// checkpoint's source restored in place) and at reconcile. One left with
// the start period (that write failed) is still held to its share, over a
// longer window. On cgroup v1 a limited parent refuses a child above its
// share at any write: runsc writes a longer period before the quota
// (scripts/gvisor/cpu-period.patch), SetCPULimit a shorter one after it.

// cpuStartPeriod is the period a sandbox of runtime rt starts with (0: the
// default, spec.CPUPeriod).
func cpuStartPeriod(rt string) uint64 {
	if rt == RuntimeGVisor {
		return spec.CPUStartPeriod
	}
	return 0
}

// settleCPU gives a started sandbox its CPU limit over spec.CPUPeriod. A
// failure is logged: the sandbox keeps its share over the start period.
func (d *Daemon) settleCPU(ctx context.Context, sb *store.Sandbox) {
	if cpuStartPeriod(sb.Runtime) == 0 || sb.Config.CPU <= 0 {
		return
	}
	err := d.host.SetCPULimit(d.cgroupPath(sb.ID), spec.CPUQuota(sb.Config.CPU, spec.CPUPeriod), spec.CPUPeriod)
	d.bestEffort(ctx, "set the CPU limit's period after the start", err, slog.String("sandbox", sb.ID))
}
