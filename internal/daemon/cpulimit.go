package daemon

import (
	"context"
	"log/slog"
	"math"
	goruntime "runtime"

	"github.com/opencontainers/runtime-spec/specs-go"

	"github.com/forkbox/forkbox/internal/runtime/spec"
	"github.com/forkbox/forkbox/internal/store"
)

// A gVisor restore gets one CPU more than the sandbox's limit, and the
// limit once the sandbox is up. A restore loads pages, decodes the kernel's
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
// source restored in place) and a container started in a pre-booted
// sandbox (whose booted Sentry already shows the limit). A fresh boot
// keeps its limit from the start:
// its Sentry shows the tenant the quota it boots with in the sandbox's own
// cgroupfs, where a restored one shows what its image holds.
//
// The raised quota is within the host's CPUs and, on cgroup v1, within any
// limited parent's share (the kernel refuses more); none where the host's
// cpu controller is not found. It lasts until the agent has answered
// (before a child's on-fork hook, which is the tenant's code); a daemon
// that dies in between leaves it, and reconcile sets the limit again.
// runsc sizes a Sentry's Go runtime (GOMAXPROCS, at least 2) from the
// quota it starts with, so a restored Sentry of a limit of 2 CPUs or more
// keeps one more thread of its own than a booted one; the tenant's CPU
// count comes from its image either way.

// startCPU is the CPU limit (cores, 0: none) sb's restore runs with.
func (d *Daemon) startCPU(sb *store.Sandbox) float64 {
	cores := sb.Config.CPU
	if sb.Runtime != RuntimeGVisor || cores <= 0 {
		return cores
	}
	hi := spec.CPUQuota(min(cores+1, float64(goruntime.NumCPU())))
	if c := d.host.CPUCeiling(d.cgroupPath(sb.ID)); !math.IsInf(c, 1) {
		hi = min(hi, int64(math.Floor(c*spec.CPUPeriod)))
	}
	return float64(max(spec.CPUQuota(cores), hi)) / spec.CPUPeriod
}

// raisedCPU reports whether sb's restores run above its limit.
func (d *Daemon) raisedCPU(sb *store.Sandbox) bool { return d.startCPU(sb) > sb.Config.CPU }

// restoreCPU gives s, the spec of a restore that makes sb's cgroup, the
// limit the restore runs with.
func (d *Daemon) restoreCPU(s *specs.Spec, sb *store.Sandbox) {
	spec.SetCPU(s, d.startCPU(sb))
}

// restoreCPUIn gives the spec in bundle dir, a restore's that makes sb's
// cgroup, the limit the restore runs with (the spec a sandbox was first
// started with holds its own limit; one a host with fewer CPUs restores
// again may hold more than it may have now).
func (d *Daemon) restoreCPUIn(dir string, sb *store.Sandbox) error {
	if sb.Runtime != RuntimeGVisor {
		return nil
	}
	s, err := spec.ReadBundle(dir)
	if err != nil {
		return err
	}
	d.restoreCPU(s, sb)
	return spec.WriteBundle(dir, s)
}

// raiseCPU raises the quota of sb's cgroup, which exists already, for a
// restore into it. A failure is logged: the restore runs at the limit.
func (d *Daemon) raiseCPU(ctx context.Context, sb *store.Sandbox) {
	if !d.raisedCPU(sb) {
		return
	}
	err := d.host.SetCPUQuota(d.cgroupPath(sb.ID), spec.CPUQuota(d.startCPU(sb)), spec.CPUPeriod)
	d.bestEffort(ctx, "raise the CPU quota for a restore", err, slog.String("sandbox", sb.ID))
}

// settleCPU gives a started gVisor sandbox its own CPU limit, whatever
// its restore ran with. A failure is logged (reconcile sets it again); the
// sandbox keeps the raised quota.
func (d *Daemon) settleCPU(ctx context.Context, sb *store.Sandbox) {
	if sb.Runtime != RuntimeGVisor || sb.Config.CPU <= 0 {
		return
	}
	err := d.host.SetCPUQuota(d.cgroupPath(sb.ID), spec.CPUQuota(sb.Config.CPU), spec.CPUPeriod)
	d.bestEffort(ctx, "set the CPU limit after a restore", err, slog.String("sandbox", sb.ID))
}
