package agent

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/forkbox/forkbox/errdefs"
)

const (
	// muxFreshFor: a session that received something this recently is
	// used as it is; an older one is pinged first, so that a session to an
	// agent that was restarted, restored or woken since is replaced before
	// a call is lost on it.
	muxFreshFor = 500 * time.Millisecond
	// muxPingTimeout bounds that ping.
	muxPingTimeout = time.Second
	// muxHandshakeTimeout bounds a new session's first answer, once the
	// connection is up (DialTimeout bounds that): a working agent on a
	// loaded host can take seconds, and the caller's context bounds it too.
	muxHandshakeTimeout = 10 * time.Second
)

// stream opens a stream of c's session, dialling the session if needed.
// It returns nil (and no error) when the agent has no sessions: the call
// then takes a connection of its own.
func (c *Client) stream(ctx context.Context, op string) (*muxStream, error) {
	c.smu.Lock()
	defer c.smu.Unlock()
	return c.streamLocked(ctx, op, true)
}

// streamLocked is stream with c.smu held; retry allows one new session
// when the open fails on the current one.
func (c *Client) streamLocked(ctx context.Context, op string, retry bool) (*muxStream, error) {
	if c.closed {
		return nil, fmt.Errorf("agent %s: client closed: %w", op, errdefs.ErrUnavailable)
	}
	if c.noMux {
		return nil, nil
	}
	m := c.sess
	if m != nil && m.alive() && m.idle() > muxFreshFor {
		if err := m.ping(muxPingTimeout); err != nil {
			// Dead, or late on a loaded host: new calls take a new
			// session, and those running on this one go on until they
			// end (a dead one fails them when its connection does).
			m.retire()
			c.retired = append(slices.DeleteFunc(c.retired, func(r *muxSession) bool { return !r.alive() }), m)
			m = nil
		}
	}
	if m == nil || !m.alive() {
		c.sess = nil
		var err error
		if m, err = c.dialSession(ctx, op); err != nil {
			if errdefs.IsNotImplemented(err) {
				c.noMux = true
				return nil, nil
			}
			return nil, err
		}
		c.sess = m
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			m.run()
		}()
	}
	st, err := m.open()
	if err != nil && retry {
		// The session died before the request left: it is safe to send it
		// on a new one.
		m.Close()
		c.sess = nil
		return c.streamLocked(ctx, op, false)
	}
	if err != nil {
		return nil, muxUnavailable(op, err)
	}
	return st, nil
}

// retire takes m out of use: no new stream opens on it, and it ends once
// the streams opened on it are closed. A ping answered late may mean a
// loaded host rather than a dead agent, and the calls running on the
// session must not fail for it.
func (m *muxSession) retire() {
	m.mu.Lock()
	m.retired = true
	end := m.active == 0
	m.mu.Unlock()
	if end {
		m.Close()
	}
}

// closed counts a stream opened here as closed (client side), and ends a
// retired session with its last stream.
func (m *muxSession) closed() {
	m.mu.Lock()
	m.active--
	end := m.retired && m.active == 0
	m.mu.Unlock()
	if end {
		m.Close()
	}
}

// dialSession dials the agent and opens a session with the current token.
func (c *Client) dialSession(ctx context.Context, op string) (*muxSession, error) {
	conn, err := c.dial(ctx, op)
	if err != nil {
		return nil, err
	}
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	fw := &frameWriter{w: conn}
	dl := time.Now().Add(max(c.DialTimeout, muxHandshakeTimeout))
	conn.SetDeadline(dl)
	br := bufio.NewReaderSize(conn, 64<<10)
	if err := fw.writeJSON(frameHeader, request{Token: *c.token.Load(), Op: opMux}); err != nil {
		conn.Close()
		return nil, c.sessionErr(ctx, op, err)
	}
	f, err := readFrame(br)
	if err != nil {
		conn.Close()
		return nil, c.sessionErr(ctx, op, err)
	}
	switch f.typ {
	case frameResult:
	case frameError:
		conn.Close()
		var we wireError
		if err := json.Unmarshal(f.payload, &we); err != nil {
			return nil, fmt.Errorf("agent %s: session: decode error: %v: %w", op, err, errdefs.ErrInternal)
		}
		return nil, we.err()
	default:
		conn.Close()
		return nil, fmt.Errorf("agent %s: session: unexpected frame %q: %w", op, f.typ, errdefs.ErrInternal)
	}
	conn.SetDeadline(time.Time{})
	if !stop() {
		conn.Close()
		return nil, ctxErr(ctx, op)
	}
	return newMuxSession(conn, br, false, nil), nil
}

func (c *Client) sessionErr(ctx context.Context, op string, err error) error {
	if ctx.Err() != nil {
		return ctxErr(ctx, op)
	}
	if errors.Is(err, errdefs.ErrResourceExhausted) {
		return err
	}
	return fmt.Errorf("agent %s: session with %s: %v: %w", op, c.addr, err, errdefs.ErrUnavailable)
}
