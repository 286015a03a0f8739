package agent

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/errdefs"
)

// drainGrace is how long the agent keeps reading an exec's stdout and stderr
// after the process exited, for output still held open by its descendants.
const drainGrace = 200 * time.Millisecond

// execState is one running exec, as the watchdog and the kill paths see it.
type execState struct {
	pid int
	// session says the exec leads its own session (a pty exec): a kill
	// reaches every process of the session, also those that job control
	// moved to other process groups.
	session   bool
	oomKilled atomic.Bool
	timedOut  atomic.Bool

	mu     sync.Mutex
	exited bool

	// A detached exec (request.Detach) outlives its client's connection:
	// its output and result go to sink, the connection that started it or
	// the one that attached since (see attach.go); finished is closed once
	// the result was written, and resulted (under mu) set just before.
	detach   atomic.Bool
	sink     atomic.Pointer[frameWriter]
	finished chan struct{}
	resulted bool
}

// execSink writes to an exec's current sink.
type execSink struct{ st *execState }

func (e execSink) write(typ, stream byte, p []byte) error {
	return e.st.sink.Load().write(typ, stream, p)
}

// killGroup SIGKILLs the exec's process group (for a session leader, its
// whole session) unless it was already reaped.
func (e *execState) killGroup() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.exited {
		return
	}
	_ = syscall.Kill(-e.pid, syscall.SIGKILL)
	if e.session {
		killSession(e.pid)
	}
}

func (e *execState) markExited() {
	e.mu.Lock()
	e.exited = true
	e.mu.Unlock()
}

func (s *Server) addExec(e *execState) {
	s.mu.Lock()
	s.execs[e.pid] = e
	delete(s.unclaimed, e.pid) // an attach to this pid means the new exec
	s.mu.Unlock()
}

func (s *Server) removeExec(e *execState) {
	s.mu.Lock()
	if s.execs[e.pid] == e {
		delete(s.execs, e.pid)
	}
	s.mu.Unlock()
}

// handleExec runs req in the foreground, streaming its output over fw, and
// answers with its ExecResult. Until the process started, the caller drains
// stdin on error; from then on readClient reads it.
func (s *Server) handleExec(body *reqBody, fw *frameWriter, hdr *request) error {
	req := hdr.Exec
	if req == nil {
		return fmt.Errorf("exec: missing exec: %w", errdefs.ErrInvalidArgument)
	}
	var stdinR, stdinW *os.File
	var err error
	if hdr.HasStdin {
		if stdinR, stdinW, err = os.Pipe(); err != nil {
			return osErr("pipe", "stdin", err)
		}
	} else if stdinR, err = os.Open(os.DevNull); err != nil {
		return osErr("open", os.DevNull, err)
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		return osErr("pipe", "stdout", err)
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		return osErr("pipe", "stderr", err)
	}
	defer func() {
		for _, f := range []*os.File{stdinR, stdinW, outR, outW, errR, errW} {
			if f != nil {
				f.Close()
			}
		}
	}()

	s.watch.begin()
	defer s.watch.end()
	start := time.Now()
	st, done, err := s.startProcess(req, [3]*os.File{stdinR, outW, errW}, false)
	if err != nil {
		return err
	}
	pid := st.pid
	defer s.removeExec(st)
	st.sink.Store(fw)
	st.finished = make(chan struct{})
	st.detach.Store(hdr.Detach)
	stdinR.Close()
	outW.Close()
	errW.Close()
	stdinR, outW, errW = nil, nil, nil
	log := s.log.With("exec", pid)
	log.Debug("exec started", "argv", req.Argv, "shell", req.Shell)
	if hdr.Notify {
		// Before the pumps start: the pid comes ahead of any output.
		if err := fw.writeJSON(frameStarted, startResult{Pid: pid}); err != nil {
			st.killGroup()
		}
	}

	var pumps sync.WaitGroup
	pumps.Add(2)
	go s.pump(&pumps, execSink{st}, streamStdout, outR)
	go s.pump(&pumps, execSink{st}, streamStderr, errR)
	stdinDone := make(chan struct{})
	go s.readClient(body.handOff(), st, stdinW, stdinDone)
	stdinW = nil // readClient owns it now

	defer st.killAfter(req.Timeout)()
	ws := <-done
	s.markSentryOOM(st, ws)
	st.markExited()
	dur := time.Since(start)
	deadline := time.Now().Add(drainGrace)
	outR.SetReadDeadline(deadline)
	errR.SetReadDeadline(deadline)
	pumps.Wait()

	res := ExecResult{Pid: pid, Duration: dur, TimedOut: st.timedOut.Load(), OOMKilled: st.oomKilled.Load()}
	res.ExitCode, res.Signal = exitStatus(ws)
	log.Debug("exec finished", "exit_code", res.ExitCode, "signal", res.Signal, "duration", dur)
	if st.detach.Load() {
		// Kept before it is written: a write that succeeds does not show
		// that a client read it (a connection cut while the sandbox was
		// hibernated can look alive to the agent), and an attach that
		// finds the exec ended gets it from here (attach.go).
		s.keepResult(pid, res)
	}
	st.mu.Lock()
	out := st.sink.Load()
	st.resulted = true
	st.mu.Unlock()
	err = out.writeJSON(frameResult, res)
	close(st.finished)
	if hdr.HasStdin {
		// Stdin the process did not read is still coming: wait for its end,
		// or closing the connection resets it and can lose the result.
		t := time.NewTimer(drainTimeout)
		defer t.Stop()
		select {
		case <-stdinDone:
		case <-t.C:
		}
	}
	return err
}

// exitStatus returns the exit code (128+signo when killed) and signal name.
func exitStatus(ws syscall.WaitStatus) (int, string) {
	if ws.Signaled() {
		sig := ws.Signal()
		name := unix.SignalName(sig)
		if name == "" {
			name = "SIG" + strconv.Itoa(int(sig))
		}
		return 128 + int(sig), name
	}
	return ws.ExitStatus(), ""
}

// frameSink takes data frames: a frameWriter, or an exec's current sink.
type frameSink interface {
	write(typ, stream byte, payload []byte) error
}

// pump copies r into data frames on stream until EOF or its read deadline
// (readUntil: what r holds at the deadline is still sent).
func (s *Server) pump(wg *sync.WaitGroup, fw frameSink, stream byte, r *os.File) {
	defer wg.Done()
	err := readUntil(r, make([]byte, chunkSize), func(p []byte) {
		// A write error means the client is gone; reading on keeps the
		// process from blocking on a full pipe.
		_ = fw.write(frameData, stream, p)
	})
	// EIO: a terminal's master once no process holds the slave.
	if !errors.Is(err, io.EOF) && !errors.Is(err, os.ErrDeadlineExceeded) && !errors.Is(err, syscall.EIO) {
		s.log.Debug("read exec output", "err", err)
	}
}

// readClient feeds stdin frames to the process and kills it if the client
// asks to or goes away before the exec ended. It closes stdinDone once the
// client's stdin ended (EOF frame) or the connection failed.
func (s *Server) readClient(conn net.Conn, st *execState, stdinW *os.File, stdinDone chan<- struct{}) {
	var doneOnce sync.Once
	done := func() { doneOnce.Do(func() { close(stdinDone) }) }
	defer done()
	defer func() {
		if stdinW != nil {
			stdinW.Close()
		}
	}()
	for {
		f, err := readFrame(conn)
		if err != nil {
			if !st.detach.Load() { // a detached exec waits for an attach
				st.killGroup()
			}
			return
		}
		switch f.typ {
		case frameData:
			if stdinW != nil {
				if _, err := stdinW.Write(f.payload); err != nil {
					stdinW.Close()
					stdinW = nil
				}
			}
		case frameEOF:
			if stdinW != nil {
				stdinW.Close()
				stdinW = nil
			}
			done()
		case frameKill:
			st.killGroup()
		}
	}
}

// handleStart runs req in the background and answers with its pid at once.
func (s *Server) handleStart(fw *frameWriter, hdr *request) error {
	req := hdr.Exec
	if req == nil {
		return fmt.Errorf("start: missing exec: %w", errdefs.ErrInvalidArgument)
	}
	if err := os.MkdirAll(s.cfg.LogDir, 0o755); err != nil {
		return osErr("mkdir", s.cfg.LogDir, err)
	}
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return osErr("open", os.DevNull, err)
	}
	defer devnull.Close()
	// The log file is named after the pid, known only after the fork: write
	// to a temp name and rename it.
	tmp, err := os.CreateTemp(s.cfg.LogDir, "exec-start-*.log")
	if err != nil {
		return osErr("create", s.cfg.LogDir, err)
	}
	defer tmp.Close()
	s.watch.begin()
	start := time.Now()
	st, done, err := s.startProcess(req, [3]*os.File{devnull, tmp, tmp}, false)
	if err != nil {
		s.watch.end()
		os.Remove(tmp.Name())
		return err
	}
	pid := st.pid
	logPath := filepath.Join(s.cfg.LogDir, "exec-"+strconv.Itoa(pid)+".log")
	if err := os.Rename(tmp.Name(), logPath); err != nil {
		s.log.Warn("rename exec log", "exec", pid, "err", err)
	}
	var timer *time.Timer
	if req.Timeout > 0 {
		timer = time.AfterFunc(req.Timeout, func() {
			st.timedOut.Store(true)
			st.killGroup()
		})
	}
	go func() {
		ws := <-done
		s.markSentryOOM(st, ws)
		st.markExited()
		if timer != nil {
			timer.Stop()
		}
		s.removeExec(st)
		s.watch.end()
		code, sig := exitStatus(ws)
		s.log.Info("background exec finished", slog.Int("exec", pid), "exit_code", code,
			"signal", sig, "duration", time.Since(start), "timed_out", st.timedOut.Load(),
			"oom_killed", st.oomKilled.Load())
	}()
	return fw.writeJSON(frameResult, startResult{Pid: pid})
}

// killAfter kills the exec's process group once d has passed (marking it
// timed out) and returns what cancels that; d <= 0 is no timeout.
func (e *execState) killAfter(d time.Duration) (stop func()) {
	if d <= 0 {
		return func() {}
	}
	t := time.AfterFunc(d, func() {
		e.timedOut.Store(true)
		e.killGroup()
	})
	return func() { t.Stop() }
}
