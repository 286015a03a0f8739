package agent

import (
	"net"
	"time"
)

// Bounds of draining the unread rest of a request body before an error reply.
const (
	drainTimeout = 10 * time.Second
	drainLimit   = MaxFileSize + maxDataFrame
)

// reqBody is a request's body: data frames (for execs also kill frames)
// closed by an EOF frame. Write requests always carry one, execs when
// HasStdin is set.
//
// The op's handler reads it. Whatever is left unread when the handler fails
// is drained in one place (handleConn) before the error frame is sent:
// closing a TCP connection with unread data resets it, and the reset can
// overtake the error frame, so that the client sees Unavailable instead of
// the error's class.
type reqBody struct {
	conn net.Conn
	// pending says a body was announced and its end not yet read.
	pending bool
	// handedOff says another goroutine reads the connection now (an exec's
	// readClient), which then owns the body's end.
	handedOff bool
}

func newReqBody(conn net.Conn, req *request) *reqBody {
	return &reqBody{conn: conn, pending: req.Op == opWrite || req.Op == opUntar || (req.Op == opExec && req.HasStdin)}
}

// next reads the body's next frame; the EOF frame or a read error ends it.
func (b *reqBody) next() (frame, error) {
	f, err := readFrame(b.conn)
	if err != nil || f.typ == frameEOF {
		b.pending = false
	}
	return f, err
}

// handOff gives the connection's reads to another goroutine.
func (b *reqBody) handOff() net.Conn {
	b.handedOff = true
	return b.conn
}

// drain discards the unread rest of the body, up to drainLimit bytes and
// drainTimeout, unless it was read to its end or handed off.
func (b *reqBody) drain() {
	if !b.pending || b.handedOff {
		return
	}
	b.pending = false
	b.conn.SetReadDeadline(time.Now().Add(drainTimeout))
	defer b.conn.SetReadDeadline(time.Time{})
	for n := 0; n <= drainLimit; {
		f, err := readFrame(b.conn)
		if err != nil || f.typ == frameEOF {
			return
		}
		n += frameHeaderLen + len(f.payload)
	}
}
