package agent

import (
	"bytes"
	"context"
	"os"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"
)

// watchInterval is how often the watchdog polls while any exec runs.
const watchInterval = 10 * time.Millisecond

// watchdog enforces the sandbox's memory limit: gVisor has no OOM killer
// inside the sandbox, and the host cgroup's kills the whole sentry. While any
// exec runs it sums the resident memory of every process but the agent (in
// non-init mode: of the agent's descendants only) and, above the limit,
// SIGKILLs the largest and marks the exec it belongs to as OOM-killed.
type watchdog struct {
	s      *Server
	limit  int64
	active atomic.Int64
	wake   chan struct{}
	killed map[int]bool // pids killed and not yet gone; not counted again
	page   int64
}

func newWatchdog(s *Server, limit int64) *watchdog {
	return &watchdog{s: s, limit: limit, wake: make(chan struct{}, 1),
		killed: map[int]bool{}, page: int64(os.Getpagesize())}
}

func (w *watchdog) begin() {
	if w.active.Add(1) == 1 {
		select {
		case w.wake <- struct{}{}:
		default:
		}
	}
}

func (w *watchdog) end() { w.active.Add(-1) }

func (w *watchdog) run(ctx context.Context) {
	if w.limit <= 0 {
		return
	}
	t := time.NewTicker(watchInterval)
	defer t.Stop()
	for {
		if w.active.Load() <= 0 {
			select {
			case <-ctx.Done():
				return
			case <-w.wake:
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		w.check()
	}
}

type procStat struct {
	ppid, pgrp int
	rss        int64 // bytes
}

// check runs one poll.
func (w *watchdog) check() {
	procs := scanProcs(w.page)
	self := os.Getpid()
	var sum int64
	victim, max := 0, int64(-1)
	for pid, p := range procs {
		if pid == self || (!w.s.cfg.Init && !descendant(procs, pid, self)) {
			continue
		}
		if w.killed[pid] {
			continue
		}
		sum += p.rss
		if p.rss > max {
			victim, max = pid, p.rss
		}
	}
	for pid := range w.killed {
		if _, ok := procs[pid]; !ok {
			delete(w.killed, pid)
		}
	}
	if sum <= w.limit || victim == 0 {
		return
	}
	_ = syscall.Kill(victim, syscall.SIGKILL)
	w.killed[victim] = true
	owner := w.owner(procs, victim)
	w.s.log.Warn("memory limit exceeded: killed largest process",
		"pid", victim, "rss", max, "total", sum, "limit", w.limit, "exec", owner)
}

// owner marks and returns the exec whose process tree pid belongs to: the
// nearest ancestor that is an exec, else the exec leading its process group.
func (w *watchdog) owner(procs map[int]procStat, pid int) int {
	w.s.mu.Lock()
	defer w.s.mu.Unlock()
	for p, depth := pid, 0; p > 1 && depth < 64; depth++ {
		if e := w.s.execs[p]; e != nil {
			e.oomKilled.Store(true)
			return p
		}
		p = procs[p].ppid
	}
	if e := w.s.execs[procs[pid].pgrp]; e != nil {
		e.oomKilled.Store(true)
		return e.pid
	}
	return 0
}

func descendant(procs map[int]procStat, pid, ancestor int) bool {
	for depth := 0; pid > 1 && depth < 64; depth++ {
		p, ok := procs[pid]
		if !ok {
			return false
		}
		if p.ppid == ancestor {
			return true
		}
		pid = p.ppid
	}
	return false
}

// scanProcs reads /proc/<pid>/stat of every live (non-zombie) process.
func scanProcs(page int64) map[int]procStat {
	d, err := os.Open("/proc")
	if err != nil {
		return nil
	}
	names, _ := d.Readdirnames(-1)
	d.Close()
	procs := make(map[int]procStat, len(names))
	var buf [1024]byte
	for _, name := range names {
		pid, err := strconv.Atoi(name)
		if err != nil {
			continue
		}
		st, ok := readStat("/proc/"+name+"/stat", buf[:])
		if !ok {
			continue
		}
		st.rss *= page
		procs[pid] = st
	}
	return procs
}

// readStat parses ppid, pgrp and rss (in pages) from a /proc/<pid>/stat
// file; zombies are reported as absent.
func readStat(path string, buf []byte) (procStat, bool) {
	f, err := os.Open(path)
	if err != nil {
		return procStat{}, false
	}
	n, _ := f.Read(buf)
	f.Close()
	b := buf[:n]
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return procStat{}, false
	}
	fields := bytes.Fields(b[i+1:])
	// fields[0] is field 3 (state) of proc(5); rss is field 24.
	if len(fields) < 22 || fields[0][0] == 'Z' || fields[0][0] == 'X' {
		return procStat{}, false
	}
	ppid, _ := strconv.Atoi(string(fields[1]))
	pgrp, _ := strconv.Atoi(string(fields[2]))
	rss, _ := strconv.ParseInt(string(fields[21]), 10, 64)
	return procStat{ppid: ppid, pgrp: pgrp, rss: rss}, true
}
