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
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	goruntime "runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
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

// standbyNice is the nice value a standby starts with, so that its exec
// and initialisers yield the CPU to the daemon's own work (nice orders
// processes within one CPU cgroup; a sandbox in a cgroup of its own is
// spared by standbyRefillAfter instead). It gets the caller's priority
// back once it waits (renice), before any command runs in it.
const standbyNice = 19

// start starts a standby with its socket at fd 3, in a process group of its
// own (see cli), at standbyNice: the calling goroutine's locked thread
// takes that nice value for the fork (the child inherits it) and gives it
// back after. tainted reports that it could not give it back.
func (p *standbyPool) start(own int) (conn *net.UnixConn, cmd *exec.Cmd, tainted bool, err error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, false, fmt.Errorf("socket pair: %w", err)
	}
	ours, theirs := os.NewFile(uintptr(fds[0]), "standby"), os.NewFile(uintptr(fds[1]), "standby-runsc")
	defer theirs.Close()
	fc, err := net.FileConn(ours) // a dup: ours is closed below
	ours.Close()
	if err != nil {
		return nil, nil, false, fmt.Errorf("socket: %w", err)
	}
	conn = fc.(*net.UnixConn)
	cmd = exec.Command(p.binary)
	cmd.Env = append(os.Environ(), standbyEnv+"=3")
	cmd.ExtraFiles = []*os.File{theirs}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	tid := unix.Gettid()
	niced := own < standbyNice && unix.Setpriority(unix.PRIO_PROCESS, tid, standbyNice) == nil
	err = cmd.Start()
	if niced && unix.Setpriority(unix.PRIO_PROCESS, tid, own) != nil {
		tainted = true
	}
	if err != nil {
		conn.Close()
		return nil, nil, tainted, err
	}
	return conn, cmd, tainted, nil
}

// threadNice is the calling thread's nice value.
func threadNice() int {
	raw, err := unix.Getpriority(unix.PRIO_PROCESS, unix.Gettid())
	if err != nil {
		return 0
	}
	return 20 - raw // the system call's value is 20 - nice
}

// renice gives every thread of process pid the nice value n (priorities
// are per thread on Linux, and a new thread takes its creator's). It goes
// over the threads until a pass finds none it has not seen.
func renice(pid, n int) error {
	seen := map[string]bool{}
	for {
		tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
		if err != nil {
			return fmt.Errorf("renice: %w", err)
		}
		fresh := false
		for _, t := range tasks {
			if seen[t.Name()] {
				continue
			}
			seen[t.Name()], fresh = true, true
			tid, err := strconv.Atoi(t.Name())
			if err != nil {
				continue
			}
			if err := unix.Setpriority(unix.PRIO_PROCESS, tid, n); err != nil && err != unix.ESRCH {
				return fmt.Errorf("renice thread %d: %w", tid, err)
			}
		}
		if !fresh {
			return nil
		}
	}
}

// hand sends c's command line and stdio and waits for the standby to take
// them. sent reports that the message went (the standby may have run it).
func hand(conn *net.UnixConn, c standbyCall) (sent bool, err error) {
	var msg strings.Builder
	for _, a := range c.args {
		if strings.IndexByte(a, 0) >= 0 {
			return false, fmt.Errorf("argument %q holds a NUL byte", a)
		}
		msg.WriteString(a)
		msg.WriteByte(0)
	}
	if msg.Len() > standbyMax {
		return false, fmt.Errorf("command line of %d bytes, more than a standby takes (%d)", msg.Len(), standbyMax)
	}
	rights := unix.UnixRights(int(c.stdio[0].Fd()), int(c.stdio[1].Fd()), int(c.stdio[2].Fd()))
	conn.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if _, _, err := conn.WriteMsgUnix([]byte(msg.String()), rights, nil); err != nil {
		return false, fmt.Errorf("send: %w", err)
	}
	// Sent: from here it may run the command. It writes Go before it
	// returns to runsc's main; without Go it has not run it.
	return true, readByteWithin(conn, standbyGo, standbyReadyWithin)
}

// tookCommand reports whether a standby, dead now, wrote its Go byte
// before it died (after hand gave up waiting for it): the byte is then in
// the socket, and the read ends at once either way (the peer is gone).
func tookCommand(conn *net.UnixConn) bool {
	return readByteWithin(conn, standbyGo, time.Second) == nil
}

// readByteWithin reads one byte, which must be want, within d.
func readByteWithin(conn *net.UnixConn, want byte, d time.Duration) error {
	conn.SetReadDeadline(time.Now().Add(d))
	var b [1]byte
	n, err := conn.Read(b[:])
	if n == 0 && err == nil {
		err = io.EOF
	}
	if err != nil {
		return err
	}
	if b[0] != want {
		return fmt.Errorf("standby wrote %q, want %q", b[0], want)
	}
	return nil
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
