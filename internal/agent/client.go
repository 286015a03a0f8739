package agent

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"golang.org/x/sys/unix"
)

// Client talks to one sandbox's agent; it is safe for concurrent use. A
// client from NewClient opens one TCP connection per call; one from
// NewSessionClient carries its calls over one session (see mux.go) and must
// be closed.
type Client struct {
	addr  string
	token atomic.Pointer[string] // Forked replaces it
	// DialTimeout bounds each connection attempt; default 2s.
	DialTimeout time.Duration

	sessions bool
	smu      sync.Mutex
	sess     *muxSession
	retired  []*muxSession // out of use, their calls still running (retire)
	noMux    bool          // the agent speaks no sessions (an older build)
	closed   bool
	wg       sync.WaitGroup
}

// NewClient returns a client for the agent at addr ("10.0.0.2:7077") that
// opens a connection per call.
func NewClient(addr, token string) *Client {
	c := &Client{addr: addr, DialTimeout: 2 * time.Second}
	c.token.Store(&token)
	return c
}

// NewSessionClient returns a client for the agent at addr whose calls share
// one session, dialled on the first call and again after it failed. An
// agent that has no sessions gets a connection per call. Close it.
func NewSessionClient(addr, token string) *Client {
	c := NewClient(addr, token)
	c.sessions = true
	return c
}

// Addr is the agent's address.
func (c *Client) Addr() string { return c.addr }

// Token is the token c sends now.
func (c *Client) Token() string { return *c.token.Load() }

// Close ends c's session, failing the calls still on it, and waits for its
// reader. Calls after Close fail with Unavailable.
func (c *Client) Close() error {
	c.smu.Lock()
	c.closed = true
	if c.sess != nil {
		c.sess.Close()
		c.sess = nil
	}
	for _, m := range c.retired {
		m.Close() // what still runs on it ends with the client
	}
	c.retired = nil
	c.smu.Unlock()
	c.wg.Wait()
	return nil
}

// call is one request in flight.
type call struct {
	conn net.Conn
	br   *bufio.Reader
	bw   *bufio.Writer
	fw   *frameWriter
	stop func() bool
}

// open dials the agent (or opens a stream of the session) and buffers the
// header frame (not yet flushed). The connection is closed when ctx ends.
func (c *Client) open(ctx context.Context, req request) (*call, error) {
	req.Token = *c.token.Load()
	var conn net.Conn
	bufSize := 64 << 10
	if c.sessions {
		st, err := c.stream(ctx, req.Op)
		if err != nil {
			return nil, err
		}
		if st != nil {
			conn, bufSize = st, 16<<10
		}
	}
	if conn == nil {
		var err error
		if conn, err = c.dial(ctx, req.Op); err != nil {
			return nil, err
		}
	}
	cl := &call{conn: conn, br: bufio.NewReaderSize(conn, bufSize), bw: bufio.NewWriterSize(conn, bufSize)}
	cl.fw = &frameWriter{w: cl.bw}
	cl.stop = context.AfterFunc(ctx, func() { conn.Close() })
	if err := cl.fw.writeJSON(frameHeader, req); err != nil {
		cl.close()
		return nil, err
	}
	return cl, nil
}

// dialKeepAlive is the TCP keepalive of the daemon's connections to an
// agent: slow, because each probe wakes an idle gVisor sandbox (about
// 1.6 ms of host CPU), and needed only to notice a sandbox that died with
// a stream open; an idle session is pinged before it is used again
// (muxFreshFor).
var dialKeepAlive = net.KeepAliveConfig{Enable: true, Idle: 2 * time.Minute, Interval: 15 * time.Second, Count: 4}

// dialUserTimeout is the TCP user timeout of the daemon's connections to
// an agent: data sent and not acknowledged for this long ends the
// connection. A sandbox whose runtime died answers nothing, not even a
// reset (its network namespace outlives it): a request sent on a session
// opened before then waited for ever (the keepalive probes only an idle
// connection). A live sandbox's network stack acknowledges at once, its
// agent busy or not; one paused for a checkpoint does after the save.
var dialUserTimeout = 30 * time.Second

func (c *Client) dial(ctx context.Context, op string) (net.Conn, error) {
	d := net.Dialer{Timeout: c.DialTimeout, KeepAliveConfig: dialKeepAlive, Control: setUserTimeout}
	conn, err := d.DialContext(ctx, "tcp", c.addr)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctxErr(ctx, op)
		}
		return nil, fmt.Errorf("agent %s: dial %s: %v: %w", op, c.addr, err, errdefs.ErrUnavailable)
	}
	return conn, nil
}

// setUserTimeout sets TCP_USER_TIMEOUT (dialUserTimeout) on a socket
// being dialled.
func setUserTimeout(_, _ string, c syscall.RawConn) error {
	var serr error
	if err := c.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(dialUserTimeout.Milliseconds()))
	}); err != nil {
		return err
	}
	return serr
}

func (cl *call) close() {
	cl.stop()
	cl.conn.Close()
}

// stopWrites makes cl's writes fail from now on: once its result is in,
// input still being sent to an agent that no longer reads it (a full
// connection, a hostile agent) must not hold its sender, and with it the
// call, until the connection closes.
func (cl *call) stopWrites() { cl.conn.SetWriteDeadline(time.Now()) }

// sendStream writes data as data frames and an EOF frame, then flushes.
func (cl *call) sendStream(data []byte) error {
	for len(data) > 0 {
		n := min(len(data), chunkSize)
		if err := cl.fw.write(frameData, streamStdin, data[:n]); err != nil {
			return err
		}
		data = data[n:]
	}
	if err := cl.fw.write(frameEOF, streamStdin, nil); err != nil {
		return err
	}
	return cl.bw.Flush()
}

// result reads frames until the result (a frame of type want, by default
// frameResult), which it decodes into out; data frames go to onData.
func (cl *call) result(ctx context.Context, op string, onData func(stream byte, p []byte) error, out any, want ...byte) error {
	end := byte(frameResult)
	if len(want) > 0 {
		end = want[0]
	}
	for {
		f, err := readFrame(cl.br)
		if err != nil {
			if ctx.Err() != nil {
				return ctxErr(ctx, op)
			}
			if errdefs.Class(err) != errdefs.ErrUnknown {
				return err
			}
			return fmt.Errorf("agent %s: %v: %w", op, err, errdefs.ErrUnavailable)
		}
		switch f.typ {
		case frameData:
			if onData != nil {
				if err := onData(f.stream, f.payload); err != nil {
					return err
				}
			}
		case end:
			if out == nil {
				return nil
			}
			if err := json.Unmarshal(f.payload, out); err != nil {
				return fmt.Errorf("agent %s: decode result: %v: %w", op, err, errdefs.ErrInternal)
			}
			return nil
		case frameError:
			var we wireError
			if err := json.Unmarshal(f.payload, &we); err != nil {
				return fmt.Errorf("agent %s: decode error: %v: %w", op, err, errdefs.ErrInternal)
			}
			return we.err()
		default:
			return fmt.Errorf("agent %s: unexpected frame %q: %w", op, f.typ, errdefs.ErrInternal)
		}
	}
}

func ctxErr(ctx context.Context, op string) error {
	class := errdefs.ErrCanceled
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		class = errdefs.ErrDeadlineExceeded
	}
	return fmt.Errorf("agent %s: %w: %w", op, class, ctx.Err())
}

// simple runs a request without a body and decodes its result into out.
func (c *Client) simple(ctx context.Context, req request, out any) error {
	cl, err := c.open(ctx, req)
	if err != nil {
		return err
	}
	defer cl.close()
	_ = cl.bw.Flush() // a write error shows up as a read error
	return cl.result(ctx, req.Op, nil, out)
}

// Ping returns the agent's version and the sandbox's hostname.
func (c *Client) Ping(ctx context.Context) (PingInfo, error) {
	var info PingInfo
	err := c.simple(ctx, request{Op: opPing}, &info)
	return info, err
}

// Sync calls sync(2) in the sandbox.
func (c *Client) Sync(ctx context.Context) error {
	return c.simple(ctx, request{Op: opSync}, nil)
}

// Forked tells the agent that its sandbox's memory was restored from a
// checkpoint (n.Reason "fork") or woken from hibernation ("wake"), and who it
// is now. The agent swaps its token for n.Token, sets its hostname when it
// is init, and runs the on-fork hook (up to 30 s; give ctx more) before it
// answers. Once Forked returns, only n.Token is accepted: on success c uses
// it from then on. A failing or missing hook is reported in the ForkReply,
// not as an error.
//
// If the call fails after the agent received it (the reply was lost), the
// token may or may not have been swapped: retry with a client holding the
// new token when the old one gets Unauthenticated.
func (c *Client) Forked(ctx context.Context, n ForkNotice) (ForkReply, error) {
	var reply ForkReply
	if err := c.simple(ctx, request{Op: opFork, Fork: &n}, &reply); err != nil {
		return reply, err
	}
	reply.HookOutput = tail(reply.HookOutput, MaxHookOutput) // what an honest agent sends at most
	if n.Token != "" {
		tok := n.Token
		c.token.Store(&tok)
	}
	return reply, nil
}

// RotateToken gives the agent a new token, tok, and nothing else (no hook,
// no hostname). The agent accepts both tokens until the first request made
// with tok; from then on only tok. On success c uses tok, so its next call
// completes the rotation. The daemon calls it on a memory checkpoint's
// source once it is restored in place (its children woke up knowing the
// source's token), records tok, then makes any call with tok; a crash in
// between leaves the recorded token working.
func (c *Client) RotateToken(ctx context.Context, tok string) error {
	if tok == "" {
		return fmt.Errorf("agent rotate: empty token: %w", errdefs.ErrInvalidArgument)
	}
	if err := c.simple(ctx, request{Op: opRotate, NewToken: tok}, nil); err != nil {
		return err
	}
	c.token.Store(&tok)
	return nil
}

// Exec runs req and waits for it, writing its stdout and stderr to the
// writers (either may be nil) as output arrives. Cancelling ctx kills the
// process group and returns a Canceled or DeadlineExceeded error.
func (c *Client) Exec(ctx context.Context, req ExecRequest, stdout, stderr io.Writer) (ExecResult, error) {
	var res ExecResult
	cl, err := c.open(ctx, request{Op: opExec, Exec: &req, HasStdin: len(req.Stdin) > 0})
	if err != nil {
		return res, err
	}
	defer cl.close()
	// Tell the agent to kill the process if ctx ends; closing the connection
	// (done by open's AfterFunc) does it too.
	stopKill := context.AfterFunc(ctx, func() {
		cl.conn.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
		var b [frameHeaderLen]byte
		b[0] = frameKill
		cl.conn.Write(b[:])
	})
	defer stopKill()
	if len(req.Stdin) > 0 {
		if len(req.Stdin) <= chunkSize {
			err = cl.sendStream(req.Stdin)
		} else {
			// Large stdin: send while reading output so neither side blocks.
			cl.bw.Flush()
			go cl.sendStream(req.Stdin)
		}
	} else {
		err = cl.bw.Flush()
	}
	_ = err // a write error shows up as a read error below
	onData := func(stream byte, p []byte) error {
		var w io.Writer
		switch stream {
		case streamStdout:
			w = stdout
		case streamStderr:
			w = stderr
		}
		if w != nil {
			if _, err := w.Write(p); err != nil {
				return fmt.Errorf("agent exec: write output: %v: %w", err, errdefs.ErrInternal)
			}
		}
		return nil
	}
	err = cl.result(ctx, opExec, onData, &res)
	return res, err
}

// Start runs req in the background and returns its pid. Its output goes to
// /tmp/.forkbox/exec-<pid>.log in the sandbox; req.Stdin is not supported.
func (c *Client) Start(ctx context.Context, req ExecRequest) (int, error) {
	if len(req.Stdin) > 0 {
		return 0, fmt.Errorf("agent start: stdin is not supported for background execs: %w", errdefs.ErrInvalidArgument)
	}
	var res startResult
	err := c.simple(ctx, request{Op: opStart, Exec: &req}, &res)
	return res.Pid, err
}

// ReadFile returns the content of the file at the absolute path.
func (c *Client) ReadFile(ctx context.Context, path string) ([]byte, error) {
	var buf bytes.Buffer
	cl, err := c.open(ctx, request{Op: opRead, Path: path})
	if err != nil {
		return nil, err
	}
	defer cl.close()
	if err := cl.bw.Flush(); err != nil {
		return nil, fmt.Errorf("agent read: %v: %w", err, errdefs.ErrUnavailable)
	}
	err = cl.result(ctx, opRead, func(_ byte, p []byte) error {
		if buf.Len()+len(p) > MaxFileSize {
			return fmt.Errorf("agent read %s: more than %d bytes: %w", path, MaxFileSize, errdefs.ErrResourceExhausted)
		}
		buf.Write(p)
		return nil
	}, nil)
	if err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// WriteFile writes data to the absolute path atomically, creating parent
// directories; mode 0 means 0644.
func (c *Client) WriteFile(ctx context.Context, path string, data []byte, mode os.FileMode) error {
	if len(data) > MaxFileSize {
		return fmt.Errorf("agent write %s: %d bytes, limit %d: %w", path, len(data), MaxFileSize, errdefs.ErrResourceExhausted)
	}
	cl, err := c.open(ctx, request{Op: opWrite, Path: path, Mode: uint32(mode.Perm()), Size: int64(len(data))})
	if err != nil {
		return err
	}
	defer cl.close()
	if len(data) <= chunkSize {
		cl.sendStream(data)
	} else {
		go cl.sendStream(data)
	}
	return cl.result(ctx, opWrite, nil, nil)
}

// ListFiles returns the entries of the directory at the absolute path,
// sorted by name: at most MaxListEntries, a larger directory is
// ResourceExhausted.
func (c *Client) ListFiles(ctx context.Context, path string) ([]FileInfo, error) {
	cl, err := c.open(ctx, request{Op: opList, Path: path, Stream: true})
	if err != nil {
		return nil, err
	}
	defer cl.close()
	_ = cl.bw.Flush() // a write error shows up as a read error
	ents := []FileInfo{}
	var res listResult
	err = cl.result(ctx, opList, func(_ byte, p []byte) error {
		var batch []FileInfo
		if err := json.Unmarshal(p, &batch); err != nil {
			return fmt.Errorf("agent list %s: decode entries: %v: %w", path, err, errdefs.ErrInternal)
		}
		if len(ents)+len(batch) > MaxListEntries {
			return tooManyEntries(path)
		}
		ents = append(ents, batch...)
		return nil
	}, &res)
	if err != nil {
		return nil, err
	}
	// An agent that does not stream sends every entry in the result.
	if len(ents)+len(res.Entries) > MaxListEntries {
		return nil, tooManyEntries(path)
	}
	ents = append(ents, res.Entries...)
	if res.Count != 0 && res.Count != len(ents) {
		return nil, fmt.Errorf("agent list %s: got %d entries, agent sent %d: %w", path, len(ents), res.Count, errdefs.ErrInternal)
	}
	return ents, nil
}

// Retry interval and per-attempt bounds of WaitReady: an attempt starts
// at readyAttempt (a SYN lost to a sandbox still starting its network is
// retried soon) and doubles after each attempt its bound cut, up to
// readyAttemptMax, so an agent that answers, only slowly (a loaded host:
// a session's handshake has taken over 2 s in CI), is waited for.
const (
	readyInterval   = 3 * time.Millisecond
	readyAttempt    = 250 * time.Millisecond
	readyAttemptMax = 4 * time.Second
)

// WaitReady pings the agent until it answers or ctx ends. A wrong token
// fails at once.
func WaitReady(ctx context.Context, c *Client) error {
	bound := readyAttempt
	for {
		actx, cancel := context.WithTimeout(ctx, bound)
		_, err := c.Ping(actx)
		cut := errors.Is(actx.Err(), context.DeadlineExceeded) && ctx.Err() == nil
		cancel()
		if err == nil {
			return nil
		}
		if errdefs.IsUnauthenticated(err) {
			return err
		}
		if cut {
			bound = min(2*bound, readyAttemptMax)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("agent %s not ready: %v: %w", c.addr, err, errdefs.ErrUnavailable)
		case <-time.After(readyInterval):
		}
	}
}

func tooManyEntries(path string) error {
	return fmt.Errorf("agent list %s: more than %d entries: %w", path, MaxListEntries, errdefs.ErrResourceExhausted)
}
