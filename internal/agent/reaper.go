package agent

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
	"syscall"
)

// reaper is the only caller of wait4 in the agent. Execs register their pid
// when they fork and get the exit status on a channel, so the init duty of
// reaping orphans never steals an exec's status.
//
// In init mode (PID 1) it reaps every child with wait4(-1); otherwise (an
// ordinary process, as in tests) it waits only for the pids registered with
// it, leaving the host process's other children alone.
type reaper struct {
	all bool
	log *slog.Logger

	// forkMu is held shared across fork+register and exclusively by a reap
	// pass, so a pid is always registered before it can be reaped.
	forkMu  sync.RWMutex
	mu      sync.Mutex
	waiters map[int]chan syscall.WaitStatus
	passes  atomic.Int64 // reap passes made, for tests
}

func newReaper(all bool, log *slog.Logger) *reaper {
	return &reaper{all: all, log: log, waiters: map[int]chan syscall.WaitStatus{}}
}

// run reaps on every SIGCHLD until ctx ends. It wakes for nothing else:
// under gVisor every wakeup of an idle sandbox costs the host about 1.6 ms
// of CPU (a timer in the sentry, a futex to the stub, the Go runtime), and
// a one-second tick here was most of an idle sandbox's cost.
func (r *reaper) run(ctx context.Context) {
	sigc := make(chan os.Signal, 1)
	signal.Notify(sigc, unix.SIGCHLD)
	defer signal.Stop(sigc)
	// No tick: SIGCHLDs coalesce but are not lost. One that comes during
	// a pass finds the channel empty (the pass began after taking the
	// last), so another pass follows; a pass reaps until none is left.
	for {
		r.reap()
		select {
		case <-ctx.Done():
			return
		case <-sigc:
		}
	}
}

// spawn runs fork (which returns a pid) and registers the pid before any reap
// pass can see it. The returned channel receives the pid's wait status once.
func (r *reaper) spawn(fork func() (int, error)) (int, <-chan syscall.WaitStatus, error) {
	r.forkMu.RLock()
	defer r.forkMu.RUnlock()
	pid, err := fork()
	if err != nil {
		return 0, nil, err
	}
	ch := make(chan syscall.WaitStatus, 1)
	r.mu.Lock()
	r.waiters[pid] = ch
	r.mu.Unlock()
	return pid, ch, nil
}

func (r *reaper) reap() {
	r.passes.Add(1)
	r.forkMu.Lock()
	defer r.forkMu.Unlock()
	if r.all {
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if err == syscall.EINTR {
				continue
			}
			if err != nil || pid <= 0 {
				return
			}
			r.dispatch(pid, ws)
		}
	}
	r.mu.Lock()
	pids := make([]int, 0, len(r.waiters))
	for pid := range r.waiters {
		pids = append(pids, pid)
	}
	r.mu.Unlock()
	for _, pid := range pids {
		var ws syscall.WaitStatus
		got, err := syscall.Wait4(pid, &ws, syscall.WNOHANG, nil)
		for err == syscall.EINTR {
			got, err = syscall.Wait4(pid, &ws, syscall.WNOHANG, nil)
		}
		if err == syscall.ECHILD {
			// Not our child (any more): report it as killed rather than hang.
			r.dispatch(pid, syscall.WaitStatus(syscall.SIGKILL))
			continue
		}
		if got == pid {
			r.dispatch(pid, ws)
		}
	}
}

func (r *reaper) dispatch(pid int, ws syscall.WaitStatus) {
	if ws.Stopped() || ws.Continued() {
		return
	}
	r.mu.Lock()
	ch := r.waiters[pid]
	delete(r.waiters, pid)
	r.mu.Unlock()
	if ch != nil {
		ch <- ws
		return
	}
	r.log.Debug("reaped orphan", "pid", pid, "status", int(ws))
}

// pending reports how many registered processes have not been reaped.
func (r *reaper) pending() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.waiters)
}
