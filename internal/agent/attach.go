package agent

import (
	"fmt"
	"time"

	"github.com/forkbox/forkbox/errdefs"
)

// handleAttach reattaches a client to a detached exec whose connection
// failed (its sandbox was hibernated and woken, say): it answers with a
// started frame, then the exec's output from now on and its result go to
// this connection, as they would have to the first. A kill frame kills
// the exec. Output the exec wrote while no client was attached may be lost;
// its result is not: an attach to one that ended is answered with its
// started frame and its result (keepResult), once.
func (s *Server) handleAttach(body *reqBody, fw *frameWriter, hdr *request) error {
	s.mu.Lock()
	st := s.execs[hdr.Pid]
	s.mu.Unlock()
	if st == nil {
		return s.sendUnclaimed(fw, hdr.Pid)
	}
	if !st.detach.Load() {
		return fmt.Errorf("attach: no running detached exec with pid %d: %w", hdr.Pid, errdefs.ErrNotFound)
	}
	st.mu.Lock()
	if st.resulted {
		st.mu.Unlock()
		return s.sendUnclaimed(fw, hdr.Pid) // kept before resulted was set
	}
	if err := fw.writeJSON(frameStarted, startResult{Pid: st.pid}); err != nil {
		st.mu.Unlock()
		return err
	}
	st.sink.Store(fw)
	st.mu.Unlock()
	conn := body.handOff()
	gone := make(chan struct{})
	go func() {
		defer close(gone)
		for {
			f, err := readFrame(conn)
			if err != nil {
				return
			}
			if f.typ == frameKill {
				st.killGroup()
			}
		}
	}()
	defer func() {
		conn.SetReadDeadline(time.Now()) // ends the reader
		<-gone
		conn.SetReadDeadline(time.Time{})
	}()
	select {
	case <-st.finished: // the result went to fw
	case <-gone: // this client left too: the exec waits for the next
	}
	return nil
}

// maxUnclaimed bounds the results of detached execs kept for an attach;
// the oldest goes first.
const maxUnclaimed = 64

// unclaimedResult is an ended detached exec's result, kept for an attach.
type unclaimedResult struct {
	res ExecResult
	at  time.Time
}

// keepResult keeps the result of the detached exec pid, which ended, for
// the next attach to it: the client it was written to may have been gone
// (its connection cut by a hibernation) without the write failing.
func (s *Server) keepResult(pid int, res ExecResult) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.unclaimed) >= maxUnclaimed {
		oldest := 0
		for p, u := range s.unclaimed {
			if oldest == 0 || u.at.Before(s.unclaimed[oldest].at) {
				oldest = p
			}
		}
		delete(s.unclaimed, oldest)
	}
	s.unclaimed[pid] = unclaimedResult{res: res, at: time.Now()}
}

// sendUnclaimed answers an attach to pid, which no longer runs, with its
// kept result (once), or NotFound.
func (s *Server) sendUnclaimed(fw *frameWriter, pid int) error {
	s.mu.Lock()
	u, ok := s.unclaimed[pid]
	delete(s.unclaimed, pid)
	s.mu.Unlock()
	if !ok {
		return fmt.Errorf("attach: no running detached exec with pid %d: %w", pid, errdefs.ErrNotFound)
	}
	err := fw.writeJSON(frameStarted, startResult{Pid: pid})
	if err == nil {
		err = fw.writeJSON(frameResult, u.res)
	}
	if err != nil {
		s.keepResult(pid, u.res) // for the next attach
	}
	return err
}
