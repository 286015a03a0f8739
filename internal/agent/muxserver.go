package agent

import (
	"bufio"
	"fmt"
	"net"

	"github.com/forkbox/forkbox/errdefs"
)

// serveMux runs a session on conn, whose header (op "mux", token checked)
// was read: every stream the client opens is served as a connection of
// its own. It returns when the session ends.
func (s *Server) serveMux(conn net.Conn, br *bufio.Reader, fw *frameWriter) {
	if _, nested := conn.(*muxStream); nested {
		fw.writeError(fmt.Errorf("a session inside a session: %w", errdefs.ErrInvalidArgument))
		return
	}
	if fw.writeJSON(frameResult, struct{}{}) != nil {
		return
	}
	m := newMuxSession(conn, br, true, func(st *muxStream) { s.handleConn(st) })
	s.muxMu.Lock()
	if s.muxClosed {
		s.muxMu.Unlock()
		return
	}
	s.muxes[m] = true
	s.muxMu.Unlock()
	defer func() {
		s.muxMu.Lock()
		delete(s.muxes, m)
		s.muxMu.Unlock()
	}()
	m.run()
}

// closeSessions ends every session but keep (nil: all); with final, no
// new one starts (Serve is ending). A fork notice ends
// the sessions a restored agent holds from its source's memory: their
// connections belong to the source.
func (s *Server) closeSessions(keep *muxSession, final bool) {
	s.muxMu.Lock()
	if final {
		s.muxClosed = true
	}
	var ms []*muxSession
	for m := range s.muxes {
		if m != keep {
			ms = append(ms, m)
		}
	}
	s.muxMu.Unlock()
	for _, m := range ms {
		m.Close()
	}
}

// sessionOf is the session conn is a stream of, or nil.
func sessionOf(conn net.Conn) *muxSession {
	if bc, ok := conn.(*bufConn); ok {
		conn = bc.Conn
	}
	if st, ok := conn.(*muxStream); ok {
		return st.m
	}
	return nil
}
