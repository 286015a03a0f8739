package main

import (
	"fmt"
	"io"
	"strings"
)

func (d *DensityResult) print(w io.Writer) {
	fmt.Fprintf(w, "density: %d live %s sandboxes (target %s, stopped: %s), memory limit %s each\n",
		d.Count, d.Runtime, densityTargetText(d.Target), d.StopReason, d.MemLimit)
	fmt.Fprintf(w, "  host memory per idle sandbox\t%.1f MiB\t(MemAvailable %.1f GiB at start, %.1f GiB lowest)\t\n",
		d.PerSandboxMiB, d.MemAvailStartGiB, d.MemAvailMinGiB)
	fmt.Fprintf(w, "  sandboxes' cgroup memory, each\t%.1f MiB\t\t\n", d.CgroupMiB)
	fmt.Fprintf(w, "  idle CPU, each\t%.2f ms/s\t(over %.0f s)\t\n", d.IdleCPUms, d.IdleWindowS)
	fmt.Fprintf(w, "  create, first 10 / last 10, pool settled\t%s\t%s\t(%.2fx; pool hits %s / %s)\n", pp(d.CreateFirst10), pp(d.CreateLast10),
		d.CreateRatio, hitsText(d.PoolHits.First10), hitsText(d.PoolHits.Last10))
	fmt.Fprintf(w, "  create, first 10 / last 10, back to back\t%s\t%s\t(%.2fx; pool hits %s / %s)\n", pp(d.BurstFirst10), pp(d.BurstLast10),
		d.BurstRatio, hitsText(d.PoolHits.BurstFirst10), hitsText(d.PoolHits.BurstLast10))
	fmt.Fprintf(w, "  exec true after 1 s idle, at 21 / at %d\t%s\t%s\t(%.2fx)\n", d.Count, pp(d.ExecAt10), pp(d.ExecAtFull), d.ExecRatio)
	fmt.Fprintf(w, "  exec true right after, at 21 / at %d\t%s\t%s\t(%.2fx)\n", d.Count, pp(d.ExecHotAt10), pp(d.ExecHotAtFull), d.ExecHotRatio)
	fmt.Fprintf(w, "  fork to ready at %d\t%s\t\t\n", d.Count, pp(d.ForkAtFull))
	fmt.Fprintf(w, "  daemon RSS, start / full\t%.0f MiB\t%.0f MiB\t\n", d.DaemonRSSStart, d.DaemonRSSFull)
	fmt.Fprintf(w, "  list all (%d pages of %d)\t%s ms\t\t\n", d.ListPages, d.ListPageSize, num(d.ListAllMS))
	fmt.Fprintf(w, "  hibernate each / all %d\t%s\t%.0f s\t\n", d.Hibernated, pp(d.Hibernate), d.HibernateAllS)
	if d.SessionsTarget > 0 {
		fmt.Fprintf(w, "  sessions, all hibernated\t%d\t(target %d, stopped: %s; %.0f s)\t\n", d.Sessions, d.SessionsTarget, d.SessionsStop, d.SessionsS)
		fmt.Fprintf(w, "  each: create + hibernate\t%s\t\t\n", pp(d.SessionMake))
		fmt.Fprintf(w, "  disk per session / memory available\t%.1f MiB\t%.1f GiB\t\n", d.DiskPerSession, d.MemAvailSessions)
	}
	fmt.Fprintf(w, "  wake on exec, among %d hibernated\t%s\t\t\n", d.Sessions, pp(d.WakeOnExec))
	if d.WakeFailed > 0 {
		fmt.Fprintf(w, "  wakes that failed\t%d\t%s\t\n", d.WakeFailed, d.WakeErr)
	}
	if ph := d.CreatePhases; ph.First10 != nil || ph.Last10 != nil {
		for _, step := range []string{"total", "reserve", "record", "rootfs", "bundle", "run", "hostname", "agent", "settle", "credentials", "state"} {
			fmt.Fprintf(w, "  create step %s p50, first 10 / last 10 / control\t%s / %s / %s ms\t\t\n", step,
				num(ph.First10[step].Median), num(ph.Last10[step].Median), num(ph.Control10[step].Median))
		}
	}
	c := d.Control
	for _, h := range []struct {
		at  string
		cpu HostCPU
	}{{fmt.Sprintf("at %d", d.Count), d.HostCPUFull}, {"control", c.HostCPU}} {
		if h.cpu.WindowS == 0 {
			continue
		}
		var top []string
		for _, p := range h.cpu.Top {
			top = append(top, fmt.Sprintf("%s %.0f", p.Comm, p.MSPerS))
		}
		fmt.Fprintf(w, "  host busy CPU %s\t%.0f ms/s\t(busiest, ms/s: %s)\t\n", h.at, h.cpu.BusyMSPerS, strings.Join(top, ", "))
	}
	fmt.Fprintf(w, "  control, all hibernated: create paced / back to back\t%s\t%s\t(last 10 over it %.2fx; pool hits %s / %s)\n", pp(c.Create10), pp(c.Burst10),
		c.CreateRatio, hitsText(c.PoolHits10), hitsText(c.PoolHitsBurst))
	fmt.Fprintf(w, "  control: exec true after 1 s idle / right after, at 21\t%s\t%s\t(at %d over it %.2fx / %.2fx)\n", pp(c.Exec), pp(c.ExecHot),
		d.Count, c.ExecRatio, c.ExecHotRatio)
	fmt.Fprintf(w, "  grow / close all\t%.0f s\t%.0f s\t\n\n", d.GrowS, d.CloseAllS)
}

// hitsText is a pool-hit count, or "?" when the bench could not see it.
func hitsText(n int) string {
	if n < 0 {
		return "?"
	}
	return fmt.Sprint(n)
}
