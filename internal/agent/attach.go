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
// the exec. Output the exec wrote while no client was attached may be lost.
func (s *Server) handleAttach(body *reqBody, fw *frameWriter, hdr *request) error {
	s.mu.Lock()
	st := s.execs[hdr.Pid]
	s.mu.Unlock()
	if st == nil || !st.detach.Load() {
		return fmt.Errorf("attach: no running detached exec with pid %d: %w", hdr.Pid, errdefs.ErrNotFound)
	}
	st.mu.Lock()
	if st.resulted {
		st.mu.Unlock()
		return fmt.Errorf("attach: exec %d has ended: %w", hdr.Pid, errdefs.ErrNotFound)
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
