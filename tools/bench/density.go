package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/forkbox/forkbox/client"
)

// The density section: as many idle gVisor sandboxes as this host holds
// (or --density-count), and what stays flat as they pile up. It checks the
// host's free memory before it starts and before every create, and stops
// growing before MemAvailable falls under --density-min-free or the
// sandboxes' host memory would pass --density-budget (other people share
// the host); the count it reached and why it stopped are in the result.
//
// JSON (the "density" object; names are kept stable, times in ms unless
// the name says otherwise):
//
//	runtime                        the runtime measured ("gvisor")
//	target_count                   --density-count (0: as many as fit)
//	count_reached                  live sandboxes at full count
//	stop_reason                    "target", "memory budget", "min free", or the error that stopped growth
//	sandbox_memory_limit           each sandbox's memory limit
//	mem_available_start_gib        the host's MemAvailable before the first create
//	mem_available_min_gib          its lowest while the sandboxes lived
//	host_mem_per_idle_sandbox_mib  (host used at full - used before) / count_reached (noisy on a shared host)
//	cgroup_mem_per_sandbox_mib     the sandboxes' parent cgroup's memory usage at full count / count_reached (0 with --host)
//	idle_cpu_ms_per_s_per_sandbox  host CPU the idle sandboxes use (their parent cgroup's cpuacct), per sandbox, over idle_window_s (0 with --host)
//	host_cpu_at_full               over that window, the host's busy CPU time and its busiest processes (HostCPU, densitybusy.go)
//	create_first10, create_last10  create call-to-ready, one at a time, each after the daemon's pre-boot
//	                               pool has settled (forkbox_preboot_pending 0): 10 with 1 live (an
//	                               unmeasured create first keys the pool to the section's resources),
//	                               10 with count-20 live
//	create_last10_over_first10     their p50 ratio
//	create_burst_first10, create_burst_last10
//	                               10 creates right after those, back to back (the pool refills
//	                               between them when it can): with 11 and count-10 live
//	create_burst_last10_over_first10  their p50 ratio
//	pool_hits                      of each 10 above, how many took a pre-booted sandbox (-1: unknown)
//	create_phases                  first10, last10, control10: the daemon's steps of the paced creates
//	                               at each end and the control's (its "create phases" debug lines), per
//	                               step; empty unless the daemon logs at debug (--daemon-log-level debug)
//	exec_at_10, exec_at_full       `true` round trips with the first 21 live and at full count, each
//	                               on a sandbox idle for a second at least (the daemon pings an
//	                               agent's session idle for over 500 ms before it uses it)
//	exec_full_over_10              their p50 ratio
//	exec_hot_at_10, exec_hot_at_full  the exec right after each of those, on the same sandbox
//	exec_hot_full_over_10          their p50 ratio
//	fork_to_ready_at_full          fork of one child, call to ready, at full count
//	daemon_rss_start_mib           the daemon's RSS before the first create (0 with --host)
//	daemon_rss_full_mib            its RSS at full count
//	list_all_ms, list_pages        listing every sandbox through pages of list_page_size
//	hibernated, hibernate          sandboxes hibernated, and each hibernate call
//	hibernate_all_s                wall time to hibernate them all (a few at once)
//	sessions_target                --density-sessions (0: no sessions phase)
//	sessions                       sandboxes, all hibernated, when the wakes are measured
//	sessions_stop_reason           "target", "min disk", or the error that stopped them
//	session_make                   each extra session: create, then hibernate, call to call
//	sessions_s                     wall time to make the extra sessions (a few at once)
//	disk_per_session_mib           free disk under the state dir used, per hibernated sandbox
//	mem_available_sessions_gib     MemAvailable with every sandbox hibernated
//	wake_on_exec                   an exec on a hibernated sandbox (the wake included), among all sessions
//	control                        the start measured again with all sessions hibernated (DensityControl)
//	grow_s, close_all_s            wall time to create them all, and to close them all
type DensityResult struct {
	Runtime          string  `json:"runtime"`
	Target           int     `json:"target_count"`
	Count            int     `json:"count_reached"`
	StopReason       string  `json:"stop_reason"`
	MemLimit         string  `json:"sandbox_memory_limit"`
	MemAvailStartGiB float64 `json:"mem_available_start_gib"`
	MemAvailMinGiB   float64 `json:"mem_available_min_gib"`
	PerSandboxMiB    float64 `json:"host_mem_per_idle_sandbox_mib"`
	CgroupMiB        float64 `json:"cgroup_mem_per_sandbox_mib"`
	IdleCPUms        float64 `json:"idle_cpu_ms_per_s_per_sandbox"`
	IdleWindowS      float64 `json:"idle_window_s"`
	HostCPUFull      HostCPU `json:"host_cpu_at_full"`
	CreateFirst10    Summary `json:"create_first10"`
	CreateLast10     Summary `json:"create_last10"`
	CreateRatio      float64 `json:"create_last10_over_first10"`
	BurstFirst10     Summary `json:"create_burst_first10"`
	BurstLast10      Summary `json:"create_burst_last10"`
	BurstRatio       float64 `json:"create_burst_last10_over_first10"`
	CreatePhases     struct {
		First10   map[string]Summary `json:"first10,omitempty"`
		Last10    map[string]Summary `json:"last10,omitempty"`
		Control10 map[string]Summary `json:"control10,omitempty"`
	} `json:"create_phases"`
	PoolHits struct {
		First10      int `json:"first10"`
		Last10       int `json:"last10"`
		BurstFirst10 int `json:"burst_first10"`
		BurstLast10  int `json:"burst_last10"`
	} `json:"pool_hits"`
	ExecAt10         Summary `json:"exec_at_10"`
	ExecAtFull       Summary `json:"exec_at_full"`
	ExecRatio        float64 `json:"exec_full_over_10"`
	ExecHotAt10      Summary `json:"exec_hot_at_10"`
	ExecHotAtFull    Summary `json:"exec_hot_at_full"`
	ExecHotRatio     float64 `json:"exec_hot_full_over_10"`
	ForkAtFull       Summary `json:"fork_to_ready_at_full"`
	DaemonRSSStart   float64 `json:"daemon_rss_start_mib"`
	DaemonRSSFull    float64 `json:"daemon_rss_full_mib"`
	ListAllMS        float64 `json:"list_all_ms"`
	ListPages        int     `json:"list_pages"`
	ListPageSize     int     `json:"list_page_size"`
	Hibernated       int     `json:"hibernated"`
	Hibernate        Summary `json:"hibernate"`
	HibernateAllS    float64 `json:"hibernate_all_s"`
	SessionsTarget   int     `json:"sessions_target"`
	Sessions         int     `json:"sessions"`
	SessionsStop     string  `json:"sessions_stop_reason,omitempty"`
	SessionMake      Summary `json:"session_make"`
	SessionsS        float64 `json:"sessions_s"`
	DiskPerSession   float64 `json:"disk_per_session_mib"`
	MemAvailSessions float64 `json:"mem_available_sessions_gib"`
	WakeOnExec       Summary `json:"wake_on_exec"`
	// WakeFailed counts the wakes on exec that failed, WakeErr the first.
	WakeFailed int            `json:"wake_failed"`
	WakeErr    string         `json:"wake_first_error,omitempty"`
	Control    DensityControl `json:"control"`
	GrowS      float64        `json:"grow_s"`
	CloseAllS  float64        `json:"close_all_s"`
}

const (
	densityRuntime  = "gvisor"
	densityParallel = 4 // creates (and hibernates) at once between the first and last 10
	densityExecs    = 50
	densityForks    = 5
	densityWakes    = 10
	densityListPage = 100
	// densityEnd is how many creates are measured at each end, paced and
	// back to back.
	densityEnd = 10
	// densitySettle bounds the wait for the pre-boot pool before a paced
	// create.
	densitySettle = time.Minute
	// densityDefault is the count tried when none is given (if it fits).
	densityDefault = 1000
	// densityGuessMiB is the host memory assumed per sandbox before ten
	// have been measured.
	densityGuessMiB = 32
	// densityMinMiB is the least host memory counted per sandbox.
	densityMinMiB = 8
	// densityIdleWindow is how long the idle sandboxes' CPU is counted.
	densityIdleWindow = 10 * time.Second
)

// measureDensity grows to the count, measures at full count, hibernates
// them all, wakes some, measures the start again (the control), and closes
// them all.
func (b *bench) measureDensity(ctx context.Context) (DensityResult, error) {
	o := b.opts
	r := DensityResult{Runtime: densityRuntime, Target: o.densityCount, MemLimit: o.densityMemory, ListPageSize: densityListPage}
	target := o.densityCount
	if target == 0 {
		target = densityDefault
	}
	avail := memAvailableGiB()
	r.MemAvailStartGiB, r.MemAvailMinGiB = avail, avail
	if avail < o.densityMinFree+1 {
		return r, fmt.Errorf("density: %.1f GiB available, want at least %.1f (the --density-min-free floor) + 1", avail, o.densityMinFree)
	}
	r.DaemonRSSStart = rssMiB(b.daemonPID)
	baseUsed := usedGiB()
	var all []*client.Sandbox
	defer func() { b.close(context.WithoutCancel(ctx), all...) }()

	// Stops growing before the host runs short: the budget is the least of
	// --density-budget and what is available above the floor.
	budgetGiB := min(o.densityBudget, avail-o.densityMinFree)
	perMiB := float64(densityGuessMiB)
	fits := func(n int) (bool, string) {
		if a := memAvailableGiB(); a < o.densityMinFree {
			return false, "min free"
		} else {
			r.MemAvailMinGiB = min(r.MemAvailMinGiB, a)
		}
		if float64(n+1)*perMiB/1024 > budgetGiB {
			return false, "memory budget"
		}
		return true, ""
	}
	create := func() (*client.Sandbox, float64, error) {
		t := time.Now()
		sb, err := b.c.CreateSandbox(ctx, client.CreateOptions{Image: b.image, Runtime: densityRuntime,
			Resources: client.Resources{Memory: o.densityMemory}})
		if err != nil {
			return nil, 0, err
		}
		b.track(sb)
		return sb, ms(time.Since(t)), nil
	}
	// end makes n sandboxes (up to the target) one at a time, after the
	// pool has settled (paced) or back to back, and returns their times
	// and pool hits. The last ends were kept room for in the budget, so
	// only the host's free-memory floor stops them.
	end := func(n int, paced, last bool) ([]float64, int, error) {
		more := func() bool {
			if len(all) >= target {
				return false
			}
			if ok, why := fits(len(all)); !ok && (!last || why == "min free") {
				if r.StopReason == "" {
					r.StopReason = why
				}
				return false
			}
			return true
		}
		out, hits, err := b.createSeries(ctx, n, paced, more, func() (float64, error) {
			sb, d, err := create()
			if err != nil {
				return 0, fmt.Errorf("density: create %d: %w", len(all)+1, err)
			}
			all = append(all, sb)
			return d, nil
		})
		return out, hits, err
	}
	began := time.Now()
	// One create unmeasured: a pool booted for the daemon's default
	// resources is booted again for the section's.
	sb, _, err := create()
	if err != nil {
		return r, fmt.Errorf("density: create 1: %w", err)
	}
	all = append(all, sb)
	from := b.logSize()
	firstMS, hits, err := end(densityEnd, true, false)
	if err != nil {
		return r, err
	}
	r.CreateFirst10, r.PoolHits.First10 = summarize(firstMS), hits
	r.CreatePhases.First10 = b.daemonPhases(from, daemonCreatePhases, "")
	burstMS, hits, err := end(densityEnd, false, false)
	if err != nil {
		return r, err
	}
	r.BurstFirst10, r.PoolHits.BurstFirst10 = summarize(burstMS), hits
	if r.StopReason != "" {
		target = len(all)
	}
	// From here the budget counts what the sandboxes take: their parent
	// cgroup's memory when the bench knows it, else the host's used memory
	// since the start (noisy on a shared host: MemAvailable's floor is the
	// guard).
	measured := func() float64 {
		per := (usedGiB() - baseUsed) * 1024 / float64(max(len(all), 1))
		if b.cgroupParent != "" {
			per = cgroupMemMiB(b.cgroupParent) / float64(max(len(all), 1))
		}
		return max(densityMinMiB, per)
	}
	perMiB = measured()
	progress("density: %d created, about %.0f MiB each; exec with them live", len(all), perMiB)
	if r.ExecAt10, r.ExecHotAt10, err = b.execSpread(ctx, all, densityExecs); err != nil {
		return r, err
	}

	// The middle, a few at a time; the last 20 one at a time again.
	var mu sync.Mutex
	var growErr error
	for r.StopReason == "" && len(all) < target-2*densityEnd {
		batch := min(densityParallel, target-2*densityEnd-len(all))
		for i := range batch {
			// Room is kept for the last 20, made one at a time below.
			if ok, why := fits(len(all) + i + 2*densityEnd); !ok {
				target, batch = len(all)+i+2*densityEnd, i
				r.StopReason = why
				break
			}
		}
		var wg sync.WaitGroup
		for range batch {
			wg.Add(1)
			go func() {
				defer wg.Done()
				sb, _, err := create()
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					growErr = err
					return
				}
				all = append(all, sb)
			}()
		}
		wg.Wait()
		if growErr != nil {
			r.StopReason = "create failed: " + growErr.Error()
			target = len(all)
			break
		}
		if len(all)%100 < densityParallel {
			progress("density: %d live, %.1f GiB available", len(all), memAvailableGiB())
			perMiB = measured()
		}
	}
	if !strings.HasPrefix(r.StopReason, "create failed") {
		stop := r.StopReason
		r.StopReason = ""
		from := b.logSize()
		lastMS, hits, err := end(densityEnd, true, true)
		if err == nil {
			r.CreateLast10, r.PoolHits.Last10 = summarize(lastMS), hits
			r.CreatePhases.Last10 = b.daemonPhases(from, daemonCreatePhases, "")
			lastMS, hits, err = end(densityEnd, false, true)
			r.BurstLast10, r.PoolHits.BurstLast10 = summarize(lastMS), hits
		}
		switch {
		case err != nil:
			r.StopReason = "create failed: " + err.Error()
		case r.StopReason == "" && stop != "":
			r.StopReason = stop
		}
	}
	if r.StopReason == "" {
		r.StopReason = "target"
	}
	r.GrowS = time.Since(began).Seconds()
	r.Count = len(all)
	r.CreateRatio = ratio(r.CreateLast10.Median, r.CreateFirst10.Median)
	r.BurstRatio = ratio(r.BurstLast10.Median, r.BurstFirst10.Median)
	r.PerSandboxMiB = (usedGiB() - baseUsed) * 1024 / float64(max(len(all), 1))
	r.DaemonRSSFull = rssMiB(b.daemonPID)
	if b.cgroupParent != "" && len(all) > 0 {
		r.CgroupMiB = cgroupMemMiB(b.cgroupParent) / float64(len(all))
		r.IdleWindowS = densityIdleWindow.Seconds()
		progress("density: %d live (%s); idle CPU over %v", len(all), r.StopReason, densityIdleWindow)
		host := sampleHost()
		r.IdleCPUms = idleCPU(ctx, b.cgroupParent, densityIdleWindow) / float64(len(all))
		r.HostCPUFull = sampleHost().since(host)
	}
	progress("density: exec, fork and list at %d live", len(all))

	if r.ExecAtFull, r.ExecHotAtFull, err = b.execSpread(ctx, all, densityExecs); err != nil {
		return r, err
	}
	r.ExecRatio = ratio(r.ExecAtFull.Median, r.ExecAt10.Median)
	r.ExecHotRatio = ratio(r.ExecHotAtFull.Median, r.ExecHotAt10.Median)
	var forks []float64
	for i := range min(densityForks, len(all)) {
		_, _, wall, err := b.forkOnce(ctx, all[rand.IntN(len(all))], fmt.Sprintf("density-%d", i))
		if err != nil {
			return r, err
		}
		forks = append(forks, wall)
	}
	r.ForkAtFull = summarize(forks)
	t := time.Now()
	n, pages, err := b.listAll(ctx)
	if err != nil {
		return r, err
	}
	r.ListAllMS = ms(time.Since(t))
	r.ListPages = pages
	if n < len(all) {
		return r, fmt.Errorf("density: the list has %d sandboxes, want at least %d", n, len(all))
	}
	r.DaemonRSSFull = max(r.DaemonRSSFull, rssMiB(b.daemonPID))

	progress("density: hibernating %d sandboxes", len(all))
	diskBefore := b.freeDiskGiB()
	hib, wall, err := b.hibernateAll(ctx, all)
	if err != nil {
		return r, err
	}
	r.Hibernated, r.Hibernate, r.HibernateAllS = len(hib), summarize(hib), wall
	if r.SessionsTarget = o.densitySessions; o.densitySessions > len(all) {
		progress("density: %d hibernated; more sessions, each hibernated once up, to %d", len(all), o.densitySessions)
		t := time.Now()
		var made []float64
		all, made, r.SessionsStop = b.growSessions(ctx, all, o.densitySessions)
		r.SessionMake, r.SessionsS = summarize(made), time.Since(t).Seconds()
	}
	r.Sessions = len(all)
	r.DiskPerSession = max(0, diskBefore-b.freeDiskGiB()) * 1024 / float64(max(len(all), 1))
	r.MemAvailSessions = memAvailableGiB()
	progress("density: wake on exec among %d hibernated", len(all))
	var wakes []float64
	var woken []*client.Sandbox
	for i := range min(densityWakes, len(all)) {
		sb := all[(i*len(all))/min(densityWakes, len(all))]
		d, err := execTrue(ctx, sb)
		if err != nil { // counted and reported: the figures before it stand
			if r.WakeFailed++; r.WakeErr == "" {
				r.WakeErr = err.Error()
			}
			progress("density: wake on exec failed: %v", err)
			continue
		}
		wakes, woken = append(wakes, d), append(woken, sb)
	}
	r.WakeOnExec = summarize(wakes)

	progress("density: the start again, with all %d hibernated (control)", len(all))
	if _, _, err := b.hibernateAll(ctx, woken); err != nil {
		return r, err
	}
	if err := b.densityControl(ctx, &r, create); err != nil {
		return r, err
	}

	t = time.Now()
	b.close(context.WithoutCancel(ctx), all...)
	r.CloseAllS = time.Since(t).Seconds()
	all = nil
	return r, nil
}
