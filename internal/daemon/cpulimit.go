package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	goruntime "runtime"
	"strconv"

	"github.com/opencontainers/runtime-spec/specs-go"

	"github.com/forkbox/forkbox/internal/runtime/runsc"
	"github.com/forkbox/forkbox/internal/runtime/spec"
	"github.com/forkbox/forkbox/internal/store"
)

// A gVisor start gets one CPU more than the sandbox's limit, and the limit
// once the sandbox is up. A restore loads pages, decodes the kernel's
// state and collects garbage on several threads at once: held to a 1-CPU
// quota per 100 ms period, memory-fork children here were throttled for
// 68–199 ms in the middle of their restore (cpu.stat; the bench's
// mem_child_cpu_throttled). Only the quota moves, never the period: the
// kernel does not re-arm a group's period timer when its period shrinks
// (a 1 s start period was tried and reverted for that), while any write of
// the quota hands the group a fresh period's worth at once, so setting the
// limit back never stalls it.
//
// Which starts: restores (a memory-fork child, its restored placeholder, a
// created placeholder that takes an image, a wake, a memory checkpoint's
// source restored in place), a container started in a pre-booted sandbox
// (whose booted Sentry already shows the limit), and fresh boots (a
// create or fork child that finds no pre-booted sandbox, a pre-booted
// placeholder's boot). A restored Sentry shows the tenant, in the
// sandbox's own cgroupfs, the quota its image holds; a booted one shows
// the quota runsc finds in the cgroup as it boots, unless the spec names
// the limit in runsc.AnnotationCPULimit (scripts/gvisor/cpu-limit.patch):
// a fresh boot is raised only with a runsc that takes it.
//
// The raised quota is within the host's CPUs and, on cgroup v1, within any
// limited parent's share (the kernel refuses more); none where the host's
// cpu controller is not found. It lasts until the agent has answered
// (before a child's on-fork hook, which is the tenant's code); a start
// whose limit cannot be set back fails, and a daemon that dies in between
// leaves the raise, which reconcile takes back.
// runsc sizes a Sentry's own Go runtime (GOMAXPROCS, at least 2) from the
// same quota as the tenant's view: a restore names the limit too, so that
// a runsc without the patch is the only one whose restored Sentry of a
// limit of 2 CPUs or more keeps a thread more than a booted one.

// startCores is the CPU limit (cores) a start of a sandbox of runtime rt
// and limit cores in cgroup cg runs with.
func (d *Daemon) startCores(rt string, cores float64, cg string) float64 {
	if rt != RuntimeGVisor || cores <= 0 {
		return cores
	}
	hi := spec.CPUQuota(min(cores+1, float64(goruntime.NumCPU())))
	if c := d.host.CPUCeiling(cg); !math.IsInf(c, 1) {
		hi = min(hi, int64(math.Floor(c*spec.CPUPeriod)))
	}
	return float64(max(spec.CPUQuota(cores), hi)) / spec.CPUPeriod
}

// startSpec gives s, the spec of a gVisor start that makes cgroup cg for a
// sandbox of runtime rt and limit cores, the quota the start runs with. A
// fresh boot (boot) is raised only with a runsc that shows the tenant the
// limit named in runsc.AnnotationCPULimit (cpu-limit.patch); a restore
// names it too (the Sentry sizes its own runtime from it). Otherwise the
// annotation goes: a spec taken from a memory image may hold the source's.
func (d *Daemon) startSpec(ctx context.Context, s *specs.Spec, rt string, cores float64, cg string, boot bool) {
	delete(s.Annotations, runsc.AnnotationCPULimit)
	start := d.startCores(rt, cores, cg)
	shows := false
	if l, ok := d.runtimes[rt].(interface{ ShowsCPULimit(context.Context) bool }); ok {
		shows = l.ShowsCPULimit(ctx)
	}
	if start <= cores || (boot && !shows) {
		spec.SetCPU(s, cores)
		return
	}
	spec.SetCPU(s, start)
	if shows {
		if s.Annotations == nil {
			s.Annotations = map[string]string{}
		}
		s.Annotations[runsc.AnnotationCPULimit] = strconv.FormatInt(spec.CPUQuota(cores), 10)
	}
}

// settleCgroup gives cgroup cg of a started gVisor sandbox its CPU limit
// cores, whatever its start ran with. Its error fails the start: a sandbox
// is not left above its limit.
func (d *Daemon) settleCgroup(rt string, cores float64, cg string) error {
	if rt != RuntimeGVisor || cores <= 0 {
		return nil
	}
	if err := d.host.SetCPUQuota(cg, spec.CPUQuota(cores), spec.CPUPeriod); err != nil {
		return fmt.Errorf("set the CPU limit after the start: %w", err)
	}
	return nil
}

// restoreCPU gives s, the spec of a restore that makes sb's cgroup, the
// limit the restore runs with.
func (d *Daemon) restoreCPU(ctx context.Context, s *specs.Spec, sb *store.Sandbox) {
	d.startSpec(ctx, s, sb.Runtime, sb.Config.CPU, d.cgroupPath(sb.ID), false)
}

// restoreCPUIn gives the spec in bundle dir, a restore's that makes sb's
// cgroup, the limit the restore runs with (the spec a sandbox was first
// started with holds its own limit; one a host with fewer CPUs restores
// again may hold more than it may have now).
func (d *Daemon) restoreCPUIn(ctx context.Context, dir string, sb *store.Sandbox) error {
	if sb.Runtime != RuntimeGVisor {
		return nil
	}
	s, err := spec.ReadRestoreBundle(dir)
	if err != nil {
		return err
	}
	d.restoreCPU(ctx, s, sb)
	return spec.WriteBundle(dir, s)
}

// raiseCPU raises the quota of sb's cgroup, which exists already, for a
// restore into it. A failure is logged: the restore runs at the limit.
func (d *Daemon) raiseCPU(ctx context.Context, sb *store.Sandbox) {
	cg := d.cgroupPath(sb.ID)
	start := d.startCores(sb.Runtime, sb.Config.CPU, cg)
	if start <= sb.Config.CPU {
		return
	}
	err := d.host.SetCPUQuota(cg, spec.CPUQuota(start), spec.CPUPeriod)
	d.bestEffort(ctx, "raise the CPU quota for a restore", err, slog.String("sandbox", sb.ID))
}

// settleCPU gives a started gVisor sandbox its own CPU limit, whatever
// its start ran with (settleCgroup).
func (d *Daemon) settleCPU(sb *store.Sandbox) error {
	return d.settleCgroup(sb.Runtime, sb.Config.CPU, d.cgroupPath(sb.ID))
}
