package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/errdefs"
)

// PTY execs.
//
// A pty request ('H' with op "pty", Exec and Pty) runs its command on a new
// pseudo-terminal pair allocated in the sandbox: the command leads a new
// session (setsid) whose controlling terminal is the slave (TIOCSCTTY), with
// the slave as its stdin, stdout and stderr; the agent holds the master.
// The agent answers with a started frame ('S', JSON {pid}) once the process
// runs, or an error frame. Only then does the client send frames: data
// frames are the terminal's input (keys, including ^C, which the terminal's
// line discipline turns into SIGINT for the foreground job), resize frames
// ('Z', JSON PtySize) set its size (the kernel sends SIGWINCH), a kill frame
// kills the session, an EOF frame ends the input. The agent streams what
// the terminal prints as data frames on stream 1 and ends with the result
// frame. A client that goes away gets the session killed.
//
// Bounds: rows and columns in 1..MaxPtyRows/MaxPtyCols; input the terminal
// has not taken yet is queued up to MaxPtyInput bytes, and input past that is
// dropped, as a terminal drops typeahead past its input queue (so the agent
// never stops reading the connection, and a kill always gets through), in
// one buffer, so that tiny frames cost no more than large ones; the exec's
// timeout applies. A client that stops reading the output holds the exec at
// most ptyWriteGrace past the process's exit: then writes to it fail and the
// exec ends. When the exec ends, every process left in its session (nohup,
// disowned jobs) is killed. The pids limit and the memory watchdog cover a
// pty exec as any other.

// ptyWriteGrace bounds how long, after the process exited and its output
// was drained, the agent waits for a client that does not read what was
// printed before it gives up writing to it.
const ptyWriteGrace = 5 * time.Second

// maxPtyKillPasses bounds the passes of killSessionAll.
const maxPtyKillPasses = 50

// Terminal size bounds and defaults.
const (
	MaxPtyRows     = 1000
	MaxPtyCols     = 1000
	DefaultPtyRows = 24
	DefaultPtyCols = 80
	// MaxPtyInput is the most input queued for a terminal that does not
	// read it; the rest is dropped.
	MaxPtyInput = 1 << 20
)

// PtySize is a terminal's size in character cells.
type PtySize struct {
	Rows int `json:"rows"`
	Cols int `json:"cols"`
}

// check validates sz; zero fields take the defaults when defaults is set.
func (sz *PtySize) check(defaults bool) error {
	if defaults {
		if sz.Rows == 0 {
			sz.Rows = DefaultPtyRows
		}
		if sz.Cols == 0 {
			sz.Cols = DefaultPtyCols
		}
	}
	if sz.Rows < 1 || sz.Rows > MaxPtyRows || sz.Cols < 1 || sz.Cols > MaxPtyCols {
		return fmt.Errorf("terminal size %dx%d: rows must be in 1..%d, cols in 1..%d: %w",
			sz.Rows, sz.Cols, MaxPtyRows, MaxPtyCols, errdefs.ErrInvalidArgument)
	}
	return nil
}

// CheckPtySize validates a terminal size as the agent does; zero rows or
// columns take the defaults.
func CheckPtySize(sz PtySize) (PtySize, error) {
	err := sz.check(true)
	return sz, err
}

// openPty allocates a pseudo-terminal pair: the master, non-blocking (so
// that reads take deadlines and a close interrupts them), and the slave.
// It uses only what gVisor's devpts implements as well as Linux's: open
// /dev/ptmx, TIOCSPTLCK, TIOCGPTN, open /dev/pts/N.
func openPty() (master, slave *os.File, err error) {
	fd, err := unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, nil, osErr("open", "/dev/ptmx", err)
	}
	master = os.NewFile(uintptr(fd), "/dev/ptmx")
	if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
		master.Close()
		return nil, nil, osErr("unlockpt", "/dev/ptmx", err)
	}
	n, err := unix.IoctlGetUint32(fd, unix.TIOCGPTN)
	if err != nil {
		master.Close()
		return nil, nil, osErr("ptsname", "/dev/ptmx", err)
	}
	name := "/dev/pts/" + strconv.FormatUint(uint64(n), 10)
	sfd, err := unix.Open(name, unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		master.Close()
		return nil, nil, osErr("open", name, err)
	}
	return master, os.NewFile(uintptr(sfd), name), nil
}

// setWinsize sets the terminal's size through its master; an error after
// the master was closed is ErrClosed, never an ioctl on a reused fd.
func setWinsize(master *os.File, sz PtySize) error {
	rc, err := master.SyscallConn()
	if err != nil {
		return err
	}
	var ioErr error
	err = rc.Control(func(fd uintptr) {
		ioErr = unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, &unix.Winsize{Row: uint16(sz.Rows), Col: uint16(sz.Cols)})
	})
	if err != nil {
		return err
	}
	return ioErr
}

// handlePty runs hdr.Exec on a new terminal (see the comment above).
func (s *Server) handlePty(body *reqBody, fw *frameWriter, hdr *request) error {
	req := hdr.Exec
	if req == nil || hdr.Pty == nil {
		return fmt.Errorf("pty: missing exec or size: %w", errdefs.ErrInvalidArgument)
	}
	size := *hdr.Pty
	if err := size.check(true); err != nil {
		return err
	}
	r := *req
	if _, ok := r.Env["TERM"]; !ok {
		env := make(map[string]string, len(r.Env)+1)
		for k, v := range r.Env {
			env[k] = v
		}
		env["TERM"] = "xterm"
		r.Env = env
	}
	master, slave, err := openPty()
	if err != nil {
		return err
	}
	defer master.Close()
	defer slave.Close()
	if err := setWinsize(master, size); err != nil {
		return osErr("set terminal size", slave.Name(), err)
	}

	s.watch.begin()
	defer s.watch.end()
	start := time.Now()
	st, done, err := s.startProcess(&r, [3]*os.File{slave, slave, slave}, true)
	if err != nil {
		return err
	}
	defer s.removeExec(st)
	slave.Close() // the process holds it; EIO on the master once all of it is gone
	pid := st.pid
	log := s.log.With("exec", pid)
	log.Debug("pty exec started", "argv", r.Argv, "shell", r.Shell, "tty", slave.Name(), "rows", size.Rows, "cols", size.Cols)
	startErr := fw.writeJSON(frameStarted, startResult{Pid: pid})

	var pumps sync.WaitGroup
	pumps.Add(1)
	go s.pump(&pumps, fw, streamStdout, master)
	in := newPtyInput()
	inDone := make(chan struct{})
	go func() {
		defer close(inDone)
		in.run(master)
	}()
	conn := body.handOff()
	go s.readPtyClient(conn, st, master, in)
	if startErr != nil {
		st.killGroup() // the client is gone already
	}
	defer st.killAfter(req.Timeout)()
	ws := <-done
	s.markSentryOOM(st, ws)
	st.markExited()
	dur := time.Since(start)
	// What the process printed is read to the end (EIO once no process holds
	// the slave), at most drainGrace after it exited.
	master.SetReadDeadline(time.Now().Add(drainGrace))
	if !waitGroupFor(&pumps, drainGrace+ptyWriteGrace) {
		// The pump is stuck writing to a client that does not read: its
		// writes fail from now on (so does the result), and it ends.
		log.Info("pty client stopped reading its output; dropping the rest", "grace", ptyWriteGrace)
		conn.SetWriteDeadline(time.Now())
		pumps.Wait()
	}
	// Jobs of the session that outlived its leader (nohup, disown) end
	// with it.
	killSessionAll(pid)
	in.close()
	master.Close() // a write blocked on a full terminal returns
	<-inDone

	res := ExecResult{Pid: pid, Duration: dur, TimedOut: st.timedOut.Load(), OOMKilled: st.oomKilled.Load()}
	res.ExitCode, res.Signal = exitStatus(ws)
	if n := in.droppedBytes(); n > 0 {
		log.Info("pty input dropped: the terminal did not read it", "bytes", n)
	}
	log.Debug("pty exec finished", "exit_code", res.ExitCode, "signal", res.Signal, "duration", dur)
	return fw.writeJSON(frameResult, res)
}

// readPtyClient reads the client's frames of a pty exec: input into in,
// resizes onto master, kills. A client that goes away before the exec ended
// gets its session killed. It never blocks on the process, so a kill always
// gets through.
func (s *Server) readPtyClient(conn net.Conn, st *execState, master *os.File, in *ptyInput) {
	for {
		f, err := readFrame(conn)
		if err != nil {
			st.killGroup()
			return
		}
		switch f.typ {
		case frameData:
			in.push(f.payload)
		case frameEOF:
			in.close()
		case frameResize:
			var sz PtySize
			if err := json.Unmarshal(f.payload, &sz); err != nil || sz.check(false) != nil {
				s.log.Debug("pty: bad resize frame ignored", "exec", st.pid)
				continue
			}
			if err := setWinsize(master, sz); err != nil && !errors.Is(err, os.ErrClosed) {
				s.log.Debug("pty: resize", "exec", st.pid, "err", err)
			}
		case frameKill:
			st.killGroup()
		}
	}
}

// ptyInput is the queue of input for a terminal: pushed by the connection's
// reader, written to the master by run. It is one byte buffer of at most
// MaxPtyInput bytes (however the input was framed: a million 1-byte frames
// cost what one 1 MiB frame does); past that, input is dropped and counted.
type ptyInput struct {
	mu      sync.Mutex
	buf     []byte // queued, not yet taken by run
	spare   []byte // the buffer run wrote last, reused
	closed  bool
	dropped int64
	wake    chan struct{}
}

func newPtyInput() *ptyInput { return &ptyInput{wake: make(chan struct{}, 1)} }

func (in *ptyInput) push(p []byte) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.closed || len(p) == 0 {
		return
	}
	if room := MaxPtyInput - len(in.buf); len(p) > room {
		in.dropped += int64(len(p) - room)
		p = p[:room]
	}
	if len(p) == 0 {
		return
	}
	if in.buf == nil {
		in.buf, in.spare = in.spare[:0], nil
	}
	in.buf = append(in.buf, p...)
	in.signal()
}

func (in *ptyInput) signal() {
	select {
	case in.wake <- struct{}{}:
	default:
	}
}

// close ends the input: run returns once it has written what is queued (or
// its writes fail).
func (in *ptyInput) close() {
	in.mu.Lock()
	in.closed = true
	in.signal()
	in.mu.Unlock()
}

func (in *ptyInput) droppedBytes() int64 {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.dropped
}

// queued returns the bytes queued and the capacity held for them.
func (in *ptyInput) queued() (n, capacity int) {
	in.mu.Lock()
	defer in.mu.Unlock()
	return len(in.buf), cap(in.buf) + cap(in.spare)
}

// run writes queued input to w until the input is closed and written, or a
// write fails (the master was closed).
func (in *ptyInput) run(w io.Writer) {
	for {
		<-in.wake
		for {
			in.mu.Lock()
			if len(in.buf) == 0 {
				closed := in.closed
				in.mu.Unlock()
				if closed {
					return
				}
				break
			}
			p := in.buf
			in.buf = nil
			in.mu.Unlock()
			_, err := w.Write(p)
			in.mu.Lock()
			in.spare = p[:0]
			if err != nil {
				in.closed = true
				in.buf = nil
				in.mu.Unlock()
				return
			}
			in.mu.Unlock()
		}
	}
}

// killSession SIGKILLs every process of session sid (job control moves a
// shell's jobs to their own process groups). Two passes catch a process
// forked while the first one read /proc.
func killSession(sid int) {
	for pass := 0; pass < 2; pass++ {
		for pid, p := range scanProcs(1) {
			if p.sid == sid {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}
}

// killSessionAll SIGKILLs every process of session sid until a scan of
// /proc finds none left (zombies count as gone), at most maxPtyKillPasses
// scans. The session id stays reserved while any of its processes lives,
// so the scan never reaches a process of another session.
func killSessionAll(sid int) {
	for pass := 0; pass < maxPtyKillPasses; pass++ {
		found := false
		for pid, p := range scanProcs(1) {
			if p.sid == sid {
				found = true
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		if !found {
			return
		}
	}
}

// waitGroupFor waits for wg at most d and says whether it is done.
func waitGroupFor(wg *sync.WaitGroup, d time.Duration) bool {
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
}
