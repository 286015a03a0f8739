package runsc

// Standby runsc processes (scripts/gvisor/standby.patch). Every runsc start
// pays an exec and the package initialisers of a 100 MB static binary
// before its main runs: about 30 ms on a 2-core host, more under load, and
// on the path of every create, restore and wake. A standby is a runsc
// started ahead with no arguments: it runs its initialisers, says it is
// ready on a socket and waits in main for its command line and stdio. The
// driver keeps Options.Standby of them and hands run, create and restore to
// one when it has one, and starts runsc as before when it does not (none
// ready, the binary replaced since, or a runsc without the patch).
//
// Each standby is started and reaped by one goroutine that keeps its OS
// thread locked meanwhile, for the same Pdeathsig reason as cli: a daemon
// killed takes its standbys (and the commands in them) with it. A standby
// that never took its command (no Go byte) ran nothing, so the caller
// starts runsc instead; one that did is followed like any runsc command.

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	goruntime "runtime"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// The standby protocol of standby.patch (runsc/forkboxstandby).
const (
	standbyEnv   = "FORKBOX_RUNSC_STANDBY_FD"
	standbyReady = 'R'
	standbyGo    = 'G'
	standbyMax   = 64 << 10 // longest command line a standby takes
)

// standbyReadyWithin bounds a standby's start until it says it is ready: a
// runsc start takes tens of milliseconds; on a host loaded enough to take
// longer, the attempt is dropped and made again.
const standbyReadyWithin = 30 * time.Second

// StandbyStats counts what became of the driver's run, create and restore
// calls.
type StandbyStats struct {
	Ready int // standbys waiting now
	// Pending are the standbys still to start before every slot has one
	// ready (those refilling after a command included); 0 once settled,
	// closed, or without the mode.
	Pending int
	Hits    int64 // commands a standby ran
	// Misses are commands that started runsc because no standby was ready
	// or could take them (a runsc without the patch makes none). Background
	// calls count in neither.
	Misses int64
	Stale  int64 // standbys let go because the binary was replaced since their start
	Lost   int64 // standbys that did not take their command (it started runsc)
	// Unsupported is set once the binary has shown it has no standby mode.
	Unsupported bool
}

type backgroundKey struct{}

// Background marks the calls made with ctx as work no one waits for (the
// pre-boot pool's refills): they start runsc themselves, and the standbys
// stay for the calls someone does wait for.
func Background(ctx context.Context) context.Context {
	return context.WithValue(ctx, backgroundKey{}, true)
}

// standbyPool keeps n standbys of one binary.
type standbyPool struct {
	binary string
	log    *slog.Logger
	// enter, when set, moves the calling goroutine's locked thread into
	// the mount namespace runsc runs in, for good (view.enter).
	enter func() error
	ready chan *standby // capacity n: one per slot at most

	mu     sync.Mutex // orders offers to ready with close
	closed bool
	stop   chan struct{}
	wg     sync.WaitGroup

	unsupported atomic.Bool
	hits        atomic.Int64
	misses      atomic.Int64
	stale       atomic.Int64
	lost        atomic.Int64
}

// standby is one runsc waiting for its command.
type standby struct {
	binary fileID
	proc   *os.Process
	calls  chan standbyCall // capacity 1: handing over never blocks
}

// standbyCall is a command handed to a standby. A zero call lets it go.
type standbyCall struct {
	args   []string
	stdio  [3]*os.File
	ran    chan bool  // whether the standby took the command
	exited chan error // then its exit, as exec.Cmd.Wait reports it
}

// fileID tells a binary from the one that replaced it.
type fileID struct {
	dev, ino   uint64
	size       int64
	mtimeNanos int64
}

func statID(path string) (fileID, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return fileID{}, err
	}
	return fileID{dev: st.Dev, ino: st.Ino, size: st.Size, mtimeNanos: st.Mtim.Nano()}, nil
}

func newStandbyPool(binary string, n int, log *slog.Logger, enter func() error) *standbyPool {
	p := &standbyPool{binary: binary, log: log, enter: enter, ready: make(chan *standby, n), stop: make(chan struct{})}
	p.wg.Add(n)
	for range n {
		go p.slot()
	}
	return p
}

// slot keeps one standby ready until the pool closes or the binary shows it
// has no standby mode.
func (p *standbyPool) slot() {
	defer p.wg.Done()
	for !p.unsupported.Load() {
		select {
		case <-p.stop:
			return
		default:
		}
		ok, ran, tainted := p.serveOne()
		if tainted {
			// This goroutine's thread is in the runsc view or kept the
			// standby's nice value: it ends with the goroutine, and
			// another slot takes its place (after a pause when this
			// one's standby could not be started).
			if !ok {
				select {
				case <-p.stop:
					return
				case <-time.After(time.Second):
				}
			}
			p.wg.Add(1)
			go p.slot()
			return
		}
		if ran {
			// The start that just ran goes on after its runsc exits (the
			// sandbox's agent answers, the fork notice): a standby's
			// start then would compete with it for the CPU (measured on
			// 2 cores: a memory child's agent answered in 62 ms p50
			// instead of 42, even at nice 19).
			select {
			case <-p.stop:
				return
			case <-time.After(standbyRefillAfter):
			}
		}
		if !ok {
			select { // a failed start: not again at once
			case <-p.stop:
				return
			case <-time.After(time.Second):
			}
		}
	}
}

// standbyRefillAfter is how long a slot waits after a command ran in its
// standby before it starts the next one.
const standbyRefillAfter = 300 * time.Millisecond

// serveOne starts a standby, offers it and follows the command it is given
// until it exits. ok is false when the standby could not be started; ran,
// when a command ran in it; tainted, when this goroutine's OS thread could
// not be given its priority back (it stays locked, and ends with the
// goroutine).
func (p *standbyPool) serveOne() (ok, ran, tainted bool) {
	goruntime.LockOSThread()
	defer func() {
		if !tainted {
			goruntime.UnlockOSThread()
		}
	}()
	if p.enter != nil {
		if unix.Gettid() == unix.Getpid() {
			// The main thread, which Go parks rather than ends: it
			// must not enter the view. The slot tries again later.
			return false, false, false
		}
		// A thread in the view never serves another goroutine.
		tainted = true
		if err := p.enter(); err != nil {
			p.log.Warn("runsc standby: start", "err", err)
			return false, false, true
		}
	}
	id, err := statID(p.binary)
	if err != nil {
		p.log.Warn("runsc standby: binary", "binary", p.binary, "err", err)
		return false, false, false
	}
	own := threadNice()
	conn, cmd, niceKept, err := p.start(own)
	tainted = tainted || niceKept
	if err != nil {
		p.log.Warn("runsc standby: start", "err", err)
		return false, false, tainted
	}
	defer conn.Close()
	err = readByteWithin(conn, standbyReady, standbyReadyWithin)
	if err == nil {
		err = renice(cmd.Process.Pid, own)
	}
	if err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		if errors.Is(err, io.EOF) && cmd.ProcessState.Exited() {
			// It exited by itself without a word: a runsc without
			// standby.patch (it printed its usage to /dev/null). One
			// killed (out of memory, say) is tried again.
			if p.unsupported.CompareAndSwap(false, true) {
				p.log.Info("runsc has no standby mode (not built by scripts/gvisor/build-runsc.sh): every run, create and restore starts runsc", "binary", p.binary)
			}
			return true, false, tainted
		}
		p.log.Warn("runsc standby: not ready", "err", err)
		return false, false, tainted
	}
	s := &standby{binary: id, proc: cmd.Process, calls: make(chan standbyCall, 1)}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		conn.Close() // the end of the stream lets it go
		cmd.Wait()
		return true, false, tainted
	}
	p.ready <- s // never blocks: one per slot
	p.mu.Unlock()
	c := <-s.calls
	if c.args == nil {
		conn.Close()
		cmd.Wait()
		return true, false, tainted
	}
	if sent, err := hand(conn, c); err != nil {
		cmd.Process.Kill()
		waitErr := cmd.Wait()
		if sent && tookCommand(conn) {
			// Its Go came after our deadline: the command ran, and was
			// killed. It must not run again.
			c.ran <- true
			c.exited <- waitErr
			return true, true, tainted
		}
		p.log.Warn("runsc standby: command not taken; starting runsc instead", "err", err)
		c.ran <- false
		return true, false, tainted
	}
	conn.Close()
	c.ran <- true
	c.exited <- cmd.Wait()
	return true, true, tainted
}

// run runs args in a standby with the given stdio. It returns ran false when
// no standby took the command: nothing ran, and the caller starts runsc.
// Otherwise err is the command's exit, as exec.Cmd.Wait reports it; a done
// ctx kills the command, as exec.CommandContext does.
func (p *standbyPool) run(ctx context.Context, args []string, stdin, stdout, stderr *os.File) (ran bool, err error) {
	if p == nil || ctx.Err() != nil {
		return false, nil // runsc's start reports a caller gone already
	}
	if ctx.Value(backgroundKey{}) != nil {
		return false, nil
	}
	var s *standby
	select {
	case s = <-p.ready:
	default:
		p.misses.Add(1)
		return false, nil
	}
	if id, err := statID(p.binary); err != nil || id != s.binary {
		s.calls <- standbyCall{}
		p.stale.Add(1)
		p.misses.Add(1)
		return false, nil
	}
	c := standbyCall{args: args, stdio: [3]*os.File{stdin, stdout, stderr}, ran: make(chan bool, 1), exited: make(chan error, 1)}
	s.calls <- c
	if !<-c.ran {
		p.lost.Add(1)
		p.misses.Add(1)
		return false, nil
	}
	p.hits.Add(1)
	select {
	case err := <-c.exited:
		return true, err
	case <-ctx.Done():
		s.proc.Kill() // a pidfd: safe even if just reaped
		return true, <-c.exited
	}
}

// close lets the ready standbys go and waits until every slot is done (a
// slot running a command ends with it).
func (p *standbyPool) close() {
	if p == nil {
		return
	}
	p.mu.Lock()
	if !p.closed {
		p.closed = true
		close(p.stop)
	}
	for drained := false; !drained; {
		select {
		case s := <-p.ready:
			s.calls <- standbyCall{}
		default:
			drained = true
		}
	}
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *standbyPool) stats() StandbyStats {
	if p == nil {
		return StandbyStats{}
	}
	st := StandbyStats{Ready: len(p.ready), Hits: p.hits.Load(), Misses: p.misses.Load(),
		Stale: p.stale.Load(), Lost: p.lost.Load(), Unsupported: p.unsupported.Load()}
	p.mu.Lock()
	closed := p.closed
	p.mu.Unlock()
	if !closed && !st.Unsupported {
		st.Pending = max(cap(p.ready)-st.Ready, 0)
	}
	return st
}

// awaitReady waits until a standby is ready and returns its pid, leaving it
// ready (tests).
func (p *standbyPool) awaitReady(ctx context.Context) (int, error) {
	select {
	case s := <-p.ready:
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.closed {
			s.calls <- standbyCall{} // close drained without it
			return 0, errors.New("standby pool closed")
		}
		p.ready <- s // never blocks: it was the only one taken
		return s.proc.Pid, nil
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}
