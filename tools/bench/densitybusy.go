package main

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// What else keeps the host busy while the density section measures: the
// host's busy CPU time and its busiest processes over a quiet window, at
// full count and again beside the control. On a small host, the host's own
// daemons that grow with the count (a VM's init scanning, the kernel's
// DAMON walking memory) slow every figure at full count; this says how
// much they took in the run that measured it.

// userHZ is the unit of /proc's CPU times (USER_HZ, 100 on every Linux
// architecture Go supports).
const userHZ = 100

// hostTopN is how many of the busiest processes a HostCPU lists.
const hostTopN = 5

// HostCPU is the host's CPU use over a window.
type HostCPU struct {
	WindowS float64 `json:"window_s"`
	// BusyMSPerS is the busy time of all CPUs (/proc/stat, all but idle
	// and iowait), per second of the window: 1000 is one core's worth.
	BusyMSPerS float64 `json:"busy_ms_per_s"`
	// Top are the busiest processes, most first (threads summed).
	Top []ProcCPU `json:"top"`
}

// ProcCPU is one process's CPU use over the window.
type ProcCPU struct {
	PID     int     `json:"pid"`
	Comm    string  `json:"comm"`
	MSPerS  float64 `json:"ms_per_s"`
	Threads int     `json:"threads"`
}

// hostSample is the host's CPU counters at one moment.
type hostSample struct {
	at    time.Time
	busy  float64 // ticks
	procs map[int]procStat
}

type procStat struct {
	comm    string
	ticks   float64 // utime + stime
	threads int
}

// sampleHost reads /proc/stat and every process's stat.
func sampleHost() hostSample {
	s := hostSample{at: time.Now(), procs: map[int]procStat{}}
	if b, err := os.ReadFile("/proc/stat"); err == nil {
		s.busy = cpuBusyTicks(string(b))
	}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue // gone
		}
		if p, ok := parseProcStat(string(b)); ok {
			s.procs[pid] = p
		}
	}
	return s
}

// cpuBusyTicks is the busy time in /proc/stat's "cpu" line: every field
// but idle and iowait.
func cpuBusyTicks(stat string) float64 {
	line, _, _ := strings.Cut(stat, "\n")
	f := strings.Fields(line)
	if len(f) < 5 || f[0] != "cpu" {
		return 0
	}
	var busy float64
	for i, v := range f[1:] {
		n, _ := strconv.ParseFloat(v, 64)
		if i != 3 && i != 4 { // idle, iowait
			busy += n
		}
	}
	return busy
}

// parseProcStat reads a /proc/<pid>/stat line: its comm (between the first
// "(" and the last ")", which may hold spaces and parentheses), utime +
// stime and the thread count.
func parseProcStat(line string) (procStat, bool) {
	open, end := strings.IndexByte(line, '('), strings.LastIndexByte(line, ')')
	if open < 0 || end < open {
		return procStat{}, false
	}
	f := strings.Fields(line[end+1:]) // f[0] is field 3, the state
	if len(f) < 18 {
		return procStat{}, false
	}
	ut, err1 := strconv.ParseFloat(f[11], 64)
	st, err2 := strconv.ParseFloat(f[12], 64)
	th, err3 := strconv.Atoi(f[17])
	if err1 != nil || err2 != nil || err3 != nil {
		return procStat{}, false
	}
	return procStat{comm: line[open+1 : end], ticks: ut + st, threads: th}, true
}

// since is the host's CPU use from a to s.
func (s hostSample) since(a hostSample) HostCPU {
	secs := s.at.Sub(a.at).Seconds()
	if secs <= 0 {
		return HostCPU{}
	}
	perS := func(ticks float64) float64 { return ticks * 1000 / userHZ / secs }
	h := HostCPU{WindowS: secs, BusyMSPerS: perS(s.busy - a.busy)}
	for pid, p := range s.procs {
		if q, ok := a.procs[pid]; ok && q.comm == p.comm && p.ticks > q.ticks {
			h.Top = append(h.Top, ProcCPU{PID: pid, Comm: p.comm, MSPerS: perS(p.ticks - q.ticks), Threads: p.threads})
		}
	}
	slices.SortFunc(h.Top, func(x, y ProcCPU) int {
		if x.MSPerS != y.MSPerS {
			if x.MSPerS > y.MSPerS {
				return -1
			}
			return 1
		}
		return x.PID - y.PID
	})
	h.Top = h.Top[:min(len(h.Top), hostTopN)]
	return h
}

// hostCPUOver samples the host over window (nothing else asked of it).
func hostCPUOver(ctx context.Context, window time.Duration) HostCPU {
	a := sampleHost()
	select {
	case <-ctx.Done():
		return HostCPU{}
	case <-time.After(window): // the measurement window itself
	}
	return sampleHost().since(a)
}
