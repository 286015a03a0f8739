package agent

import (
	"bytes"
	"context"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// watchInterval is the watchdog's poll interval while any process but the
// agent lives (or an exec runs). With none it does not poll at all: only
// the agent starts processes in a sandbox with no other (startProcess wakes
// the watchdog), and an idle sandbox with a timer firing ten times a second
// costs its host CPU that a thousand of them cannot afford (several ms a
// second each under gVisor, for nothing).
const watchInterval = 10 * time.Millisecond

// sentryWatchInterval is the poll interval where gVisor's sentry enforces
// the limit itself (Config.SentryEnforcesMemory). The sentry refuses a
// private allocation over the limit as it is made; the watchdog is left
// for what it does not refuse, pages of shared memory (MAP_SHARED
// anonymous mappings, mapped tmpfs and /dev/shm files), which it charges
// but lets a fault allocate. Such a mapping fills at about 100 MB/s under
// gVisor here, so 250 ms lets it pass the limit by tens of MB, within the
// host backstop's headroom of at least 512 MiB (daemon's hostMemoryLimit),
// at a fortieth of the 10 ms poll's CPU.
const sentryWatchInterval = 250 * time.Millisecond

// watchdog enforces the sandbox's memory limit: gVisor has no OOM killer
// inside the sandbox, and the host cgroup's kills the whole sentry. Whenever
// a limit is set it sums the resident memory of every process but the agent
// and, above the limit, SIGKILLs the largest and marks the exec it belongs
// to as OOM-killed. It polls every interval while there is any such
// process, so background execs and processes that outlive their exec are
// watched too, and not at all otherwise; starting a process wakes it at
// once.
//
// In non-init mode (tests, an agent that is not PID 1) it counts only the
// agent's descendants and the members of the process groups of the
// processes it started, which covers orphans those left behind unless they
// left their group.
type watchdog struct {
	s      *Server
	limit  int64
	active atomic.Int64
	wake   chan struct{}
	killed map[int]bool // pids killed and not yet gone; not counted again
	page   int64
	idle   atomic.Bool // no timer armed: waiting for a process to start
	// interval is the poll interval while a process lives.
	interval time.Duration

	// groups are the process groups of the processes the agent started
	// (non-init mode only), each with the scan generation current when it
	// was added; a group is forgotten by the first scan that started after
	// it was added and found no member.
	mu     sync.Mutex
	groups map[int]uint64
	gen    uint64
}

func newWatchdog(s *Server, limit int64, interval time.Duration) *watchdog {
	return &watchdog{s: s, limit: limit, interval: interval, wake: make(chan struct{}, 1),
		killed: map[int]bool{}, page: int64(os.Getpagesize()), groups: map[int]uint64{}}
}

// begin makes the watchdog poll fast until end, whatever it finds.
func (w *watchdog) begin() {
	w.active.Add(1)
	w.poke()
}

func (w *watchdog) end() { w.active.Add(-1) }

// started tells the watchdog about a process the agent started, the leader
// of a new process group.
func (w *watchdog) started(pid int) {
	if w.limit <= 0 {
		return
	}
	if !w.s.cfg.Init {
		w.mu.Lock()
		w.groups[pid] = w.gen
		w.mu.Unlock()
	}
	w.poke()
}

// poke wakes the watchdog for a poll now.
func (w *watchdog) poke() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

func (w *watchdog) run(ctx context.Context) {
	if w.limit <= 0 {
		return
	}
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-w.wake:
		}
		w.idle.Store(false)
		if w.check() || w.active.Load() > 0 || w.groupsLeft() {
			t.Reset(w.interval)
		} else {
			t.Stop() // idle: until the next process starts
			w.idle.Store(true)
		}
	}
}

// groupsLeft reports whether a process group the agent started may still
// have members (non-init mode): a group is forgotten only once the kernel
// says it is empty (kill(-g, 0) is ESRCH), so this holds while a scan of
// /proc that missed a process would not (a process read as it changed).
func (w *watchdog) groupsLeft() bool {
	if w.s.cfg.Init {
		return false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.groups) > 0
}

type procStat struct {
	ppid, pgrp, sid int
	rss             int64 // bytes
}

// check runs one poll and reports whether it found any process to watch.
func (w *watchdog) check() bool {
	var groups map[int]bool
	var gen uint64
	if !w.s.cfg.Init {
		w.mu.Lock()
		w.gen++
		gen = w.gen
		groups = make(map[int]bool, len(w.groups))
		for g := range w.groups {
			groups[g] = true
		}
		w.mu.Unlock()
	}
	// Not init (tests, or an agent that is not PID 1): only this server's
	// execs and their descendants count, not every child of the process.
	var roots map[int]bool
	if !w.s.cfg.Init {
		w.s.mu.Lock()
		roots = make(map[int]bool, len(w.s.execs))
		for pid := range w.s.execs {
			roots[pid] = true
		}
		w.s.mu.Unlock()
	}
	procs := scanProcs(w.page)
	self := os.Getpid()
	var sum int64
	victim, max, watched := 0, int64(-1), 0
	live := map[int]bool{} // process groups with members (non-init mode)
	for pid, p := range procs {
		if pid == self {
			continue
		}
		if !w.s.cfg.Init {
			if groups[p.pgrp] {
				live[p.pgrp] = true
			} else if !underExec(procs, pid, roots) {
				continue
			}
		}
		watched++
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
	if !w.s.cfg.Init {
		w.mu.Lock()
		for g, added := range w.groups {
			// The scan lists /proc, then reads each process: a member that forks
			// and exits in between hides its child. kill(-g, 0) asks the kernel.
			if added < gen && !live[g] && syscall.Kill(-g, 0) == syscall.ESRCH {
				delete(w.groups, g)
			}
		}
		w.mu.Unlock()
	}
	if sum <= w.limit || victim == 0 {
		return watched > 0
	}
	// A fork registers its exec under forkMu (shared): with it held here,
	// a victim forked after the scan began is registered by now, so the
	// kill is attributed to its exec.
	w.s.reaper.forkMu.Lock()
	_ = syscall.Kill(victim, syscall.SIGKILL)
	w.killed[victim] = true
	owner := w.owner(procs, victim)
	w.s.reaper.forkMu.Unlock()
	w.s.log.Warn("memory limit exceeded: killed largest process",
		"pid", victim, "rss", max, "total", sum, "limit", w.limit, "exec", owner)
	return true
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

// underExec reports whether pid is one of roots or descends from one.
func underExec(procs map[int]procStat, pid int, roots map[int]bool) bool {
	for depth := 0; pid > 1 && depth < 64; depth++ {
		if roots[pid] {
			return true
		}
		p, ok := procs[pid]
		if !ok {
			return false
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

// readStat parses ppid, pgrp, session and rss (in pages) from a /proc/<pid>/stat
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
	sid, _ := strconv.Atoi(string(fields[3]))
	rss, _ := strconv.ParseInt(string(fields[21]), 10, 64)
	return procStat{ppid: ppid, pgrp: pgrp, sid: sid, rss: rss}, true
}
