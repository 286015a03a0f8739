package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"
)

// Report is everything one run measured.
type Report struct {
	Host        string          `json:"host"`
	Daemon      string          `json:"daemon"`
	Started     time.Time       `json:"started"`
	DurationS   float64         `json:"duration_s"`
	Floor       Summary         `json:"raw_floor"`
	Runtimes    []RuntimeResult `json:"runtimes"`
	Profiles    []ProfileResult `json:"exec_profile,omitempty"`
	Forks       []ForkResult    `json:"forks"`
	Fanouts     []FanoutResult  `json:"fanouts"`
	Busy        []BusyResult    `json:"busy_capture"`
	Env         *EnvResult      `json:"environments,omitempty"`
	Memory      []MemoryResult  `json:"memory_forks,omitempty"`
	E2B         *E2BResult      `json:"e2b,omitempty"`
	Density     *DensityResult  `json:"density,omitempty"`
	Cluster     []ClusterResult `json:"cluster,omitempty"`
	Peers       *PeerResult     `json:"peers,omitempty"`
	BaseUsedGiB float64         `json:"mem_used_at_start_gib"`
	PeakUsedGiB float64         `json:"mem_used_peak_gib"`
	Targets     []Target        `json:"targets"`
}

// Target is one goal and whether this run met it.
type Target struct {
	What string  `json:"what"`
	Goal float64 `json:"goal_ms"`
	Got  float64 `json:"got_ms"`
	Met  bool    `json:"met"`
	// HostFloorMS, when not 0, is the least this host allows for the
	// figure whatever forkbox does, measured in the same run (issue 17's
	// fan-out: its page floor).
	HostFloorMS float64 `json:"host_floor_ms,omitempty"`
}

// Goals the figures are held to.
const (
	goalCaptureMS      = 30
	goalCrunForkMS     = 100
	goalFanoutGvisorMS = 10_000
	// gVisor at container speed: create → first exec and fork to child
	// ready (p50), exec of true on each runtime (p50), and every exec's
	// p95 within this factor of its p50.
	goalStartGvisorMS  = 80
	goalExecGvisorMS   = 3
	goalExecCrunMS     = 1
	goalExecP95OverP50 = 3
	// goalEnvOverSetup: build once + N forked runs within this factor of
	// one setup.
	goalEnvOverSetup = 1.2
	goalHandoverMS   = 10
	// Density: the last creates and execs at full count within this
	// factor of the first; the daemon's RSS (MiB) and a wake on exec.
	goalDensityRatio = 1.5
	goalDaemonRSSMiB = 500
	goalWakeMS       = 300
)

func (r *Report) targets() []Target {
	var ts []Target
	add := func(what string, goal, got float64) {
		ts = append(ts, Target{What: what, Goal: goal, Got: got, Met: got < goal})
	}
	for _, x := range r.Runtimes {
		switch x.Runtime {
		case "gvisor":
			add("gVisor create + first exec p50", goalStartGvisorMS, x.CreateFirstExec.Median)
			add("gVisor exec true p50", goalExecGvisorMS, x.ExecTrue.Median)
		case "crun":
			add("crun exec true p50", goalExecCrunMS, x.ExecTrue.Median)
		}
		add(fmt.Sprintf("%s exec true p95 within %dx p50", x.Runtime, goalExecP95OverP50),
			goalExecP95OverP50*x.ExecTrue.Median, x.ExecTrue.P95)
	}
	for _, f := range r.Forks {
		add(fmt.Sprintf("capture p50 %s %s", f.Runtime, f.Size), goalCaptureMS, f.Capture.Median)
	}
	for _, f := range r.Forks {
		if f.Runtime == "gvisor" {
			add("gVisor fork-to-child-ready p50 "+f.Size+" (call to ready)", goalStartGvisorMS, f.ForkWall.Median)
		}
	}
	for _, f := range r.Forks {
		if f.Runtime == "crun" && f.Size == "1GB" {
			add("crun fork-to-child-ready p50 1GB (call to ready)", goalCrunForkMS, f.ForkWall.Median)
		}
	}
	for _, f := range r.Fanouts {
		if f.Runtime == "gvisor" && f.Count == 100 {
			add("100 gVisor children (TotalMS)", goalFanoutGvisorMS, f.TotalMS)
		}
	}
	if e := r.E2B; e != nil {
		add("E2B endpoint overhead per call (run true, p50 difference)", goalE2BOverheadMS, e.ExecOverheadMS)
	}
	for _, t := range memTargets { // issue 17's, as the memory table prints them
		for _, m := range r.Memory {
			if m.Size != t.size {
				continue
			}
			if v, ok := t.got(m); ok {
				tg := Target{What: fmt.Sprintf("gVisor %s (%s resident)", t.what, m.Size), Goal: t.limit, Got: v, Met: t.met(v)}
				tg.HostFloorMS, _ = t.hostFloor(m)
				ts = append(ts, tg)
			}
		}
	}
	if d := r.Density; d != nil && d.Count > 0 {
		if d.CreateLast10.N > 0 {
			add(fmt.Sprintf("density: create p50 of the last 10 (at %d live) within %.1fx the first 10", d.Count, goalDensityRatio),
				goalDensityRatio*d.CreateFirst10.Median, d.CreateLast10.Median)
		}
		add(fmt.Sprintf("density: exec p50 at %d live within %.1fx at 10", d.Count, goalDensityRatio),
			goalDensityRatio*d.ExecAt10.Median, d.ExecAtFull.Median)
		if d.DaemonRSSFull > 0 {
			add(fmt.Sprintf("density: daemon RSS at %d live (MiB, not ms)", d.Count), goalDaemonRSSMiB, d.DaemonRSSFull)
		}
		if d.WakeOnExec.N > 0 {
			add(fmt.Sprintf("density: wake-on-exec p50 with %d hibernated", d.Sessions), goalWakeMS, d.WakeOnExec.Median)
		}
	}
	if e := r.Env; e != nil {
		add(fmt.Sprintf("env: build once + %d forked runs, sequential (%.1fx one setup of %s s)", e.Runs, goalEnvOverSetup, num(e.Setup.Median/1000)),
			goalEnvOverSetup*e.Setup.Median, e.ForkTotalMS)
		if e.ConcTotalMS > 0 {
			add(fmt.Sprintf("env: build once + %d forked runs, %d at a time (%.1fx one setup)", e.Runs, envParallel, goalEnvOverSetup),
				goalEnvOverSetup*e.Setup.Median, e.ConcTotalMS)
		}
		if e.HandoverDaemon.N > 0 {
			add("env: pool hand-over p50, daemon-side (HandoverMS)", goalHandoverMS, e.HandoverDaemon.Median)
			add("env: pool hand-over p50, client call", goalHandoverMS, e.HandoverClient.Median)
		}
	}
	return append(ts, clusterTargets(r.Cluster)...)
}

func pp(s Summary) string {
	if s.N == 0 {
		return "-"
	}
	return fmt.Sprintf("%s / %s", num(s.Median), num(s.P95))
}

func num(x float64) string {
	switch {
	case x >= 100:
		return fmt.Sprintf("%.0f", x)
	case x >= 10:
		return fmt.Sprintf("%.1f", x)
	default:
		return fmt.Sprintf("%.2f", x)
	}
}

func (r *Report) print(out io.Writer) {
	w := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
	fmt.Fprintf(w, "forkbox bench — %s — daemon %s\n", r.Host, r.Daemon)
	fmt.Fprintf(w, "all times in ms as p50 / p95; run took %.0f s; memory used %.1f GiB at start, peak %.1f GiB\n\n",
		r.DurationS, r.BaseUsedGiB, r.PeakUsedGiB)

	if len(r.Runtimes) > 0 {
		r.printStart(w)
	}
	if len(r.Profiles) > 0 {
		printProfiles(w, r.Profiles)
	}
	if len(r.Forks) > 0 {
		r.printForks(w)
	}
	if len(r.Fanouts) > 0 {
		r.printFanouts(w)
	}
	if len(r.Busy) > 0 {
		r.printBusy(w)
	}
	if r.Env != nil {
		r.Env.print(w)
	}
	if len(r.Memory) > 0 {
		printMemory(w, r.Memory)
	}
	if r.E2B != nil {
		r.E2B.print(w)
	}
	if r.Density != nil {
		r.Density.print(w)
	}
	printCluster(w, r.Cluster)
	if r.Peers != nil {
		r.Peers.print(w)
	}

	fmt.Fprintln(w, "targets")
	for _, t := range r.Targets {
		verdict := "met"
		if !t.Met {
			verdict = fmt.Sprintf("MISSED by %s ms (%.1fx)", num(t.Got-t.Goal), t.Got/t.Goal)
		}
		fmt.Fprintf(w, "%s\t< %s\tgot %s\t%s\t\n", t.What, num(t.Goal), num(t.Got), verdict)
	}
	w.Flush()
}

func (r *Report) printStart(w io.Writer) {
	fmt.Fprintf(w, "1. start and exec (raw floor: namespaced chroot /bin/true = %s, n=%d)\n", pp(r.Floor), r.Floor.N)
	fmt.Fprintln(w, "runtime\tcreate+first exec\texec true\tcreate/floor\texec/floor\t")
	var gv, cr *RuntimeResult
	for i, x := range r.Runtimes {
		fmt.Fprintf(w, "%s\t%s\t%s\t%.0fx\t%.0fx\t\n", x.Runtime, pp(x.CreateFirstExec), pp(x.ExecTrue), x.CreateOverFloor, x.ExecOverFloor)
		switch x.Runtime {
		case "gvisor":
			gv = &r.Runtimes[i]
		case "crun":
			cr = &r.Runtimes[i]
		}
	}
	if gv != nil && cr != nil {
		fmt.Fprintf(w, "gvisor/crun\t%.1fx\t%.1fx\t\t\t\n", ratio(gv.CreateFirstExec.Median, cr.CreateFirstExec.Median),
			ratio(gv.ExecTrue.Median, cr.ExecTrue.Median))
	}
	fmt.Fprintln(w)
}

func (r *Report) printForks(w io.Writer) {
	fmt.Fprintf(w, "2. fork of one child (n=%d each) vs naive baseline = fresh sandbox + same writes\n", firstN(r.Forks))
	fmt.Fprintln(w, "runtime\tsize\tfiles\tcapture\tchild start\tcall→ready\tbaseline p50\tbaseline/fork\t")
	for _, f := range r.Forks {
		fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%.0fx\t\n", f.Runtime, f.Size, f.Files, pp(f.Capture), pp(f.ChildStart),
			pp(f.ForkWall), num(f.Baseline.Median), f.Speedup)
	}
	fmt.Fprintln(w)
}

func (r *Report) printFanouts(w io.Writer) {
	fmt.Fprintln(w, "3. fan-out: one fork call")
	fmt.Fprintln(w, "runtime\tchildren\tstarted\tcapture\ttotal\tchild start\tclose all\t")
	for _, f := range r.Fanouts {
		fmt.Fprintf(w, "%s\t%d\t%d\t%s\t%s\t%s\t%s\t\n", f.Runtime, f.Count, f.Started, num(f.CaptureMS),
			num(f.TotalMS), pp(f.ChildStart), num(f.CloseMS))
		if f.FirstErr != "" {
			fmt.Fprintf(w, "\t%d failed; first: %s\t\t\t\t\t\t\n", f.Failed, f.FirstErr)
		}
	}
	fmt.Fprintln(w)
}

func (r *Report) printBusy(w io.Writer) {
	fmt.Fprintln(w, "4. capture of a CPU-busy source (busy loops started with Start) vs the same source idle")
	fmt.Fprintln(w, "runtime\tloops\tidle capture\tbusy capture\tbusy/idle\t")
	for _, x := range r.Busy {
		fmt.Fprintf(w, "%s\t%d\t%s\t%s\t%.1fx\t\n", x.Runtime, x.Loops, pp(x.Idle), pp(x.Busy), x.Ratio)
	}
	fmt.Fprintln(w)
}

func firstN(fs []ForkResult) int {
	if len(fs) == 0 {
		return 0
	}
	return fs[0].Capture.N
}

// memSampler records the host's used memory (MemTotal - MemAvailable).
type memSampler struct {
	once       sync.Once
	done       chan struct{}
	mu         sync.Mutex
	base, peak float64
}

func startMemSampler() *memSampler {
	m := &memSampler{done: make(chan struct{})}
	m.base = usedGiB()
	m.peak = m.base
	go func() {
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-m.done:
				return
			case <-t.C:
				u := usedGiB()
				m.mu.Lock()
				m.peak = max(m.peak, u)
				m.mu.Unlock()
			}
		}
	}()
	return m
}

// stop ends sampling and returns the peak and the starting figure.
func (m *memSampler) stop() (peak, base float64) {
	m.once.Do(func() { close(m.done) })
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.peak, m.base
}

func meminfo() map[string]float64 {
	out := map[string]float64{}
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return out
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) >= 2 {
			v, _ := strconv.ParseFloat(fs[1], 64)
			out[strings.TrimSuffix(fs[0], ":")] = v / (1 << 20) // kB → GiB
		}
	}
	return out
}

// hostCPUBusy is the time every CPU of the host has spent busy since boot
// (/proc/stat: user, nice, system, irq and softirq; not idle, iowait, the
// hypervisor's steal, or guest time, which user holds already), in seconds;
// 0 when unreadable.
func hostCPUBusy() float64 {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	fs := strings.Fields(line)
	if len(fs) < 8 || fs[0] != "cpu" {
		return 0
	}
	var busy float64
	for i, v := range fs[1:] {
		if i == 3 || i == 4 || i >= 7 {
			continue
		}
		n, _ := strconv.ParseFloat(v, 64)
		busy += n
	}
	return busy / 100 // USER_HZ
}

func usedGiB() float64 {
	m := meminfo()
	return m["MemTotal"] - m["MemAvailable"]
}

func memTotal() string { return fmt.Sprintf("%.1f GiB RAM", meminfo()["MemTotal"]) }
