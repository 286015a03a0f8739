package agent

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"time"

	"github.com/forkbox/forkbox/errdefs"
)

// A session ("mux") carries many requests over one TCP connection, so that
// a call costs no dial and no handshake. The client opens the connection
// with a header frame of op "mux" and the token; once the agent answered
// with a result frame, both sides speak mux frames:
//
//	stream id uint32 | kind byte | uint32 length | payload
//
// Each stream is one request exactly as on a connection of its own (the
// same frames, the same token check, the same handlers): a stream is a
// net.Conn to both sides. Kinds: open (client → agent, a new stream; ids
// only grow), data (bytes of the stream), window (uint32: the receiver
// read that many bytes; a sender has at most muxWindow unacknowledged
// bytes per stream, and a receiver that gets more ends the session), close
// (the sender is done with the stream both ways: the receiver reads what is
// buffered, then EOF, and its writes fail, as after a TCP close), ping and
// pong (8 bytes echoed). Frames for a stream that is gone are dropped.
const (
	opMux = "mux"

	muxOpen   = 'o'
	muxData   = 'd'
	muxWin    = 'w'
	muxClose  = 'c'
	muxPing   = 'p'
	muxPong   = 'q'
	muxHdrLen = 9

	muxMaxFrame = 64 << 10
	muxWindow   = 256 << 10
	// muxMaxStreams bounds a session's open streams on the agent's side.
	muxMaxStreams = 256
	// muxWriteTimeout bounds one frame's write to the connection: a peer
	// that stops reading ends the session.
	muxWriteTimeout = 10 * time.Second
)

// errMuxClosed is the error of a stream's calls after its session ended.
var errMuxClosed = errors.New("agent session closed")

// muxSession is one end of a session.
type muxSession struct {
	conn   net.Conn
	br     *bufio.Reader
	server bool
	// accept runs a stream the client opened (agent side), in its own
	// goroutine.
	accept func(*muxStream)

	wmu  sync.Mutex
	wbuf []byte

	mu       sync.Mutex
	streams  map[uint32]*muxStream
	nextID   uint32
	lastID   uint32 // agent side: the highest id opened
	pings    map[uint64]chan struct{}
	pingSeq  uint64
	lastRecv time.Time
	err      error
	done     chan struct{}
	// active counts the streams opened here and not yet closed here;
	// retired: no new stream, and the session ends when active is 0.
	active  int
	retired bool
}

func newMuxSession(conn net.Conn, br *bufio.Reader, server bool, accept func(*muxStream)) *muxSession {
	return &muxSession{conn: conn, br: br, server: server, accept: accept, streams: map[uint32]*muxStream{},
		pings: map[uint64]chan struct{}{}, lastRecv: time.Now(), done: make(chan struct{})}
}

// run reads frames until the connection fails or the session is closed.
func (m *muxSession) run() {
	var h [muxHdrLen]byte
	for {
		if _, err := io.ReadFull(m.br, h[:]); err != nil {
			m.fail(err)
			return
		}
		id, kind, n := binary.BigEndian.Uint32(h[0:]), h[4], binary.BigEndian.Uint32(h[5:])
		if n > muxMaxFrame {
			m.fail(fmt.Errorf("mux frame of %d bytes", n))
			return
		}
		p := make([]byte, n)
		if _, err := io.ReadFull(m.br, p); err != nil {
			m.fail(err)
			return
		}
		if err := m.dispatch(id, kind, p); err != nil {
			m.fail(err)
			return
		}
	}
}

func (m *muxSession) dispatch(id uint32, kind byte, p []byte) error {
	switch kind {
	case muxOpen, muxData, muxWin, muxClose, muxPing, muxPong:
	default:
		return fmt.Errorf("mux: unknown frame kind %q", kind)
	}
	m.mu.Lock()
	m.lastRecv = time.Now()
	st := m.streams[id]
	switch kind {
	case muxOpen:
		if !m.server || id <= m.lastID {
			m.mu.Unlock()
			return fmt.Errorf("mux: bad open of stream %d", id)
		}
		m.lastID = id
		if len(m.streams) >= muxMaxStreams {
			m.mu.Unlock()
			return m.writeFrame(id, muxClose, nil)
		}
		st = m.newStream(id)
		m.mu.Unlock()
		go m.accept(st)
		return nil
	case muxPing:
		m.mu.Unlock()
		return m.writeFrame(id, muxPong, p)
	case muxPong:
		if len(p) == 8 {
			if ch := m.pings[binary.BigEndian.Uint64(p)]; ch != nil {
				close(ch)
				delete(m.pings, binary.BigEndian.Uint64(p))
			}
		}
		m.mu.Unlock()
		return nil
	}
	m.mu.Unlock()
	if st == nil {
		return nil // a stream closed here: drop what was in flight
	}
	switch kind {
	case muxData:
		return st.received(p)
	case muxWin:
		if len(p) != 4 {
			return fmt.Errorf("mux: window frame of %d bytes", len(p))
		}
		return st.credited(int(binary.BigEndian.Uint32(p)))
	case muxClose:
		m.remove(id)
		st.remoteClosed()
	}
	return nil
}

// newStream registers stream id; m.mu is held.
func (m *muxSession) newStream(id uint32) *muxStream {
	st := &muxStream{m: m, id: id, credit: muxWindow, rsig: make(chan struct{}, 1), wsig: make(chan struct{}, 1)}
	m.streams[id] = st
	return st
}

func (m *muxSession) remove(id uint32) {
	m.mu.Lock()
	delete(m.streams, id)
	m.mu.Unlock()
}

// open starts a new stream (client side).
func (m *muxSession) open() (*muxStream, error) {
	m.mu.Lock()
	if m.err != nil {
		m.mu.Unlock()
		return nil, m.err
	}
	if m.retired {
		m.mu.Unlock()
		return nil, fmt.Errorf("%w: retired", errMuxClosed)
	}
	m.nextID++
	st := m.newStream(m.nextID)
	m.active++
	m.mu.Unlock()
	if err := m.writeFrame(st.id, muxOpen, nil); err != nil {
		m.remove(st.id)
		m.closed()
		return nil, err
	}
	return st, nil
}

// ping sends a ping and waits up to timeout for its pong.
func (m *muxSession) ping(timeout time.Duration) error {
	m.mu.Lock()
	if m.err != nil {
		m.mu.Unlock()
		return m.err
	}
	m.pingSeq++
	seq := m.pingSeq
	ch := make(chan struct{})
	m.pings[seq] = ch
	m.mu.Unlock()
	var p [8]byte
	binary.BigEndian.PutUint64(p[:], seq)
	if err := m.writeFrame(0, muxPing, p[:]); err != nil {
		return err
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-ch:
		return nil
	case <-m.done:
		return m.err
	case <-t.C:
		m.mu.Lock()
		delete(m.pings, seq)
		m.mu.Unlock()
		return fmt.Errorf("no pong within %s", timeout)
	}
}

// idle is how long the session has received nothing.
func (m *muxSession) idle() time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	return time.Since(m.lastRecv)
}

func (m *muxSession) alive() bool {
	select {
	case <-m.done:
		return false
	default:
		return true
	}
}

// writeFrame writes one frame, whole, within muxWriteTimeout.
func (m *muxSession) writeFrame(id uint32, kind byte, p []byte) error {
	m.wmu.Lock()
	defer m.wmu.Unlock()
	if !m.alive() {
		return m.err
	}
	m.wbuf = append(m.wbuf[:0], 0, 0, 0, 0, kind, 0, 0, 0, 0)
	binary.BigEndian.PutUint32(m.wbuf[0:], id)
	binary.BigEndian.PutUint32(m.wbuf[5:], uint32(len(p)))
	m.wbuf = append(m.wbuf, p...)
	m.conn.SetWriteDeadline(time.Now().Add(muxWriteTimeout))
	if _, err := m.conn.Write(m.wbuf); err != nil {
		m.fail(err)
		return m.err
	}
	return nil
}

// fail ends the session (once) with err: the connection is closed and
// every stream's calls fail.
func (m *muxSession) fail(err error) {
	m.mu.Lock()
	if m.err != nil {
		m.mu.Unlock()
		return
	}
	m.err = fmt.Errorf("%w: %v", errMuxClosed, err)
	close(m.done)
	m.mu.Unlock()
	m.conn.Close()
}

// Close ends the session.
func (m *muxSession) Close() error {
	m.fail(errors.New("closed"))
	return nil
}

// muxStream is one request's byte stream in a session, as a net.Conn.
type muxStream struct {
	m  *muxSession
	id uint32

	// wmu makes each Write contiguous on the stream.
	wmu sync.Mutex

	mu         sync.Mutex
	buf        []byte
	rclosed    bool // the peer closed: EOF after buf
	lclosed    bool
	credit     int // bytes this side may still send
	unacked    int // bytes read since the last window frame
	rdl, wdl   time.Time
	rsig, wsig chan struct{}
}

func notify(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

func (s *muxStream) received(p []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lclosed {
		return nil
	}
	if len(s.buf)+len(p) > muxWindow {
		return fmt.Errorf("mux: stream %d overran its window", s.id)
	}
	s.buf = append(s.buf, p...)
	notify(s.rsig)
	return nil
}

func (s *muxStream) credited(n int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.credit += n
	if s.credit > muxWindow {
		return fmt.Errorf("mux: stream %d credited past its window", s.id)
	}
	notify(s.wsig)
	return nil
}

func (s *muxStream) remoteClosed() {
	s.mu.Lock()
	s.rclosed = true
	s.mu.Unlock()
	notify(s.rsig)
	notify(s.wsig)
}

// wait blocks until sig, the session's end or the deadline dl.
func (s *muxStream) wait(sig chan struct{}, dl time.Time) {
	var tc <-chan time.Time
	if !dl.IsZero() {
		t := time.NewTimer(time.Until(dl))
		defer t.Stop()
		tc = t.C
	}
	select {
	case <-sig:
	case <-s.m.done:
	case <-tc:
	}
}

func (s *muxStream) Read(p []byte) (int, error) {
	for {
		s.mu.Lock()
		switch {
		case s.lclosed:
			s.mu.Unlock()
			return 0, net.ErrClosed
		case len(s.buf) > 0:
			n := copy(p, s.buf)
			s.buf = s.buf[n:]
			if len(s.buf) == 0 {
				s.buf = nil
			}
			s.unacked += n
			ack := 0
			if !s.rclosed && s.unacked >= muxWindow/4 {
				ack, s.unacked = s.unacked, 0
			}
			s.mu.Unlock()
			if ack > 0 {
				var w [4]byte
				binary.BigEndian.PutUint32(w[:], uint32(ack))
				s.m.writeFrame(s.id, muxWin, w[:]) // a failure ends the session
			}
			return n, nil
		case s.rclosed:
			s.mu.Unlock()
			return 0, io.EOF
		case !s.m.alive():
			s.mu.Unlock()
			return 0, s.m.err
		case !s.rdl.IsZero() && !time.Now().Before(s.rdl):
			s.mu.Unlock()
			return 0, os.ErrDeadlineExceeded
		}
		dl := s.rdl
		s.mu.Unlock()
		s.wait(s.rsig, dl)
	}
}

func (s *muxStream) Write(p []byte) (int, error) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	written := 0
	for len(p) > 0 {
		s.mu.Lock()
		switch {
		case s.lclosed:
			s.mu.Unlock()
			return written, net.ErrClosed
		case s.rclosed:
			s.mu.Unlock()
			return written, io.ErrClosedPipe
		case !s.m.alive():
			s.mu.Unlock()
			return written, s.m.err
		case !s.wdl.IsZero() && !time.Now().Before(s.wdl):
			s.mu.Unlock()
			return written, os.ErrDeadlineExceeded
		case s.credit > 0:
			n := min(len(p), s.credit, muxMaxFrame)
			s.credit -= n
			s.mu.Unlock()
			if err := s.m.writeFrame(s.id, muxData, p[:n]); err != nil {
				return written, err
			}
			p, written = p[n:], written+n
			continue
		}
		dl := s.wdl
		s.mu.Unlock()
		s.wait(s.wsig, dl)
	}
	return written, nil
}

// Close ends the stream both ways; the peer is told unless it closed first.
func (s *muxStream) Close() error {
	s.mu.Lock()
	if s.lclosed {
		s.mu.Unlock()
		return nil
	}
	s.lclosed = true
	tell := !s.rclosed
	s.buf = nil
	s.mu.Unlock()
	notify(s.rsig)
	notify(s.wsig)
	s.m.remove(s.id)
	if tell {
		s.m.writeFrame(s.id, muxClose, nil)
	}
	if !s.m.server {
		s.m.closed()
	}
	return nil
}

func (s *muxStream) LocalAddr() net.Addr  { return s.m.conn.LocalAddr() }
func (s *muxStream) RemoteAddr() net.Addr { return s.m.conn.RemoteAddr() }

func (s *muxStream) SetDeadline(t time.Time) error {
	s.SetReadDeadline(t)
	return s.SetWriteDeadline(t)
}

func (s *muxStream) SetReadDeadline(t time.Time) error {
	s.mu.Lock()
	s.rdl = t
	s.mu.Unlock()
	notify(s.rsig)
	return nil
}

func (s *muxStream) SetWriteDeadline(t time.Time) error {
	s.mu.Lock()
	s.wdl = t
	s.mu.Unlock()
	notify(s.wsig)
	return nil
}

// muxUnavailable wraps a session error for a caller.
func muxUnavailable(op string, err error) error {
	return fmt.Errorf("agent %s: %v: %w", op, err, errdefs.ErrUnavailable)
}
