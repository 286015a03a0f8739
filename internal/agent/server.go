package agent

import (
	"bufio"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/errdefs"
)

// Config configures a Server.
type Config struct {
	// Addr is the TCP address to listen on (ListenAndServe only).
	Addr string
	// Token must open every request; an empty token is refused by NewServer.
	// A fork notice replaces it (see Client.Forked).
	Token string
	// MemoryLimit is the sandbox's memory limit in bytes; 0 turns the
	// watchdog off.
	MemoryLimit int64
	// SentryEnforcesMemory: gVisor's sentry enforces MemoryLimit where
	// private memory is allocated (scripts/gvisor/memory-limit.patch), so
	// the watchdog is only the backstop for shared memory, which the sentry
	// does not refuse, and polls every sentryWatchInterval instead of every
	// watchInterval (its 10 ms poll of /proc was most of a gVisor
	// sandbox's CPU whenever a process ran). An exec killed by the sentry's
	// OOM killer is reported as the watchdog's kills are (markSentryOOM).
	SentryEnforcesMemory bool
	// Init is true when the agent is the sandbox's PID 1: it then reaps every
	// child and the watchdog counts every process. When false (tests, or an
	// agent that is not init) it reaps and watches its own descendants only.
	Init bool
	// PidsLimit, if positive, becomes the RLIMIT_NPROC (soft and hard) of
	// every process the agent starts, set between fork and exec by Helper.
	// The kernel (gVisor's sentry too) then refuses a fork with EAGAIN once
	// the user owns that many tasks. The daemon sets it under gVisor, where
	// the host pids cgroup counts the runtime's own tasks (see doc.go).
	PidsLimit int64
	// Helper, if set, is the agent binary, run as "Helper exec-limited N
	// bin argv..." to apply PidsLimit. Empty: the native helper (see
	// limithelper.go), else os.Executable() where there is none.
	Helper string
	// LogDir holds background execs' output; default /tmp/.forkbox.
	LogDir string
	// Env is the base environment of user processes (KEY=VALUE); default
	// os.Environ(). FORKBOX_* variables are removed from it.
	Env []string
	// Logger; default slog.Default().
	Logger *slog.Logger
	// ForkHooks are the candidate on-fork hooks, in order: the first that is
	// an executable regular file runs on every fork notice. Nil means
	// DefaultForkHooks; an empty non-nil slice runs no hook.
	ForkHooks []string
	// ForkHookTimeout bounds the hook's run; default DefaultForkHookTimeout.
	ForkHookTimeout time.Duration
}

// Server is the agent's request server.
type Server struct {
	cfg         Config
	log         *slog.Logger
	baseEnv     map[string]string
	reaper      *reaper
	watch       *watchdog
	oomAdjusted bool
	// limiter applies PidsLimit (nil: cfg.Helper does, or no limit).
	limiter *limitHelper

	// token is the accepted token; a fork notice swaps it. pending is the
	// token a rotate installed: accepted besides token until its first use,
	// which makes it the only one. forkMu orders fork notices and rotations.
	token   atomic.Pointer[string]
	pending atomic.Pointer[string]
	forkMu  sync.Mutex

	mu    sync.Mutex
	execs map[int]*execState
	// unclaimed holds the results of ended detached execs, each for one
	// attach (see keepResult).
	unclaimed map[int]unclaimedResult

	// muxes are the open sessions (see mux.go).
	muxMu     sync.Mutex
	muxes     map[*muxSession]bool
	muxClosed bool
}

// NewServer returns a server for cfg. Call Serve or ListenAndServe to run it.
func NewServer(cfg Config) (*Server, error) {
	if cfg.Token == "" {
		return nil, fmt.Errorf("agent: empty token: %w", errdefs.ErrInvalidArgument)
	}
	if cfg.Addr == "" {
		cfg.Addr = ":7077"
	}
	if cfg.LogDir == "" {
		cfg.LogDir = "/tmp/.forkbox"
	}
	if cfg.Env == nil {
		cfg.Env = os.Environ()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.ForkHooks == nil {
		cfg.ForkHooks = DefaultForkHooks
	}
	if cfg.ForkHookTimeout <= 0 {
		cfg.ForkHookTimeout = DefaultForkHookTimeout
	}
	var helper *limitHelper
	if cfg.PidsLimit > 0 && cfg.Helper == "" {
		var err error
		if helper, err = newLimitHelper(cfg.PidsLimit); err != nil {
			cfg.Logger.Warn("agent: pids limit: no native helper, using the agent's own binary (slower execs)", "err", err)
		}
	}
	if cfg.PidsLimit > 0 && cfg.Helper == "" && helper == nil {
		exe, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("agent: pids limit: own binary: %v: %w", err, errdefs.ErrInternal)
		}
		cfg.Helper = exe
	}
	s := &Server{cfg: cfg, log: cfg.Logger, baseEnv: baseEnv(cfg.Env), execs: map[int]*execState{}, unclaimed: map[int]unclaimedResult{}, limiter: helper,
		muxes: map[*muxSession]bool{}}
	tok := cfg.Token
	s.token.Store(&tok)
	s.cfg.Token = "" // s.token is the only copy that counts
	s.reaper = newReaper(cfg.Init, cfg.Logger)
	interval := watchInterval
	if cfg.SentryEnforcesMemory {
		interval = sentryWatchInterval
	}
	s.watch = newWatchdog(s, cfg.MemoryLimit, interval)
	return s, nil
}

// ListenAndServe listens on cfg.Addr and serves until ctx ends.
func (s *Server) ListenAndServe(ctx context.Context) error {
	ln, err := listen(ctx, s.cfg.Addr)
	if err != nil {
		return err
	}
	return s.Serve(ctx, ln)
}

// listen listens on addr for the daemon's connections. They get no TCP
// keepalive from the agent's side: the peer is the host's kernel, which
// closes the connection when the daemon goes, and a probe every 15 s (Go's
// default) wakes an idle gVisor sandbox for nothing. The daemon's side
// keeps a slow one (dialKeepAlive).
func listen(ctx context.Context, addr string) (net.Listener, error) {
	lc := net.ListenConfig{KeepAlive: -1}
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("agent: listen %s: %v: %w", addr, err, errdefs.ErrUnavailable)
	}
	return ln, nil
}

// Serve accepts connections on ln until ctx ends, then closes ln. The reaper
// and the watchdog run as long as Serve does; Serve serves once.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if s.limiter != nil {
		defer s.limiter.f.Close()
	}
	go s.reaper.run(ctx)
	go s.watch.run(ctx)
	// Sessions end with Serve; none starts after.
	defer s.closeSessions(nil, true)
	go func() {
		<-ctx.Done()
		ln.Close()
	}()
	s.log.Info("agent serving", "addr", ln.Addr().String(), "init", s.cfg.Init,
		"memory_limit", s.cfg.MemoryLimit, "memory_enforcer", s.memoryEnforcer(), "version", Version)
	for {
		conn, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return fmt.Errorf("agent: accept: %v: %w", err, errdefs.ErrUnavailable)
		}
		go s.handleConn(conn)
	}
}

// headerTimeout bounds how long a connection may take to send its header.
const headerTimeout = 10 * time.Second

func (s *Server) handleConn(conn net.Conn) {
	defer conn.Close()
	br := bufio.NewReaderSize(conn, 64<<10)
	rconn := &bufConn{Conn: conn, r: br}
	fw := &frameWriter{w: conn}
	conn.SetReadDeadline(time.Now().Add(headerTimeout))
	f, err := readFrame(br)
	if err != nil || f.typ != frameHeader {
		return
	}
	conn.SetReadDeadline(time.Time{})
	var req request
	if err := json.Unmarshal(f.payload, &req); err != nil {
		fw.writeError(fmt.Errorf("bad request header: %v: %w", err, errdefs.ErrInvalidArgument))
		return
	}
	received := time.Now()
	body := newReqBody(rconn, &req)
	if !s.tokenOK(req.Token) {
		s.log.Warn("agent: bad token", "remote", conn.RemoteAddr().String())
		body.drain()
		fw.writeError(fmt.Errorf("bad token: %w", errdefs.ErrUnauthenticated))
		return
	}
	if req.Op == opMux {
		s.serveMux(conn, br, fw)
		return
	}
	if err := s.dispatch(body, fw, &req, received); err != nil {
		// Read the rest of the body first, or the error may be lost.
		body.drain()
		fw.writeError(err)
	}
}

// tokenOK reports whether tok is a token accepted now. The first use of a
// pending (rotated-to) token makes it the only accepted one.
func (s *Server) tokenOK(tok string) bool {
	if subtle.ConstantTimeCompare([]byte(tok), []byte(*s.token.Load())) == 1 {
		return true
	}
	p := s.pending.Load()
	if p == nil || subtle.ConstantTimeCompare([]byte(tok), []byte(*p)) != 1 {
		return false
	}
	s.forkMu.Lock()
	defer s.forkMu.Unlock()
	if s.pending.CompareAndSwap(p, nil) {
		s.token.Store(p)
		s.log.Info("agent token rotated: the new token is in use, the old one is no longer accepted")
	}
	return subtle.ConstantTimeCompare([]byte(tok), []byte(*s.token.Load())) == 1
}

// dispatch runs req; received is when its header arrived. Handlers of ops
// with a body read it from body; on error the caller drains what is left.
func (s *Server) dispatch(body *reqBody, fw *frameWriter, req *request, received time.Time) error {
	switch req.Op {
	case opPing:
		host, _ := os.Hostname()
		return fw.writeJSON(frameResult, PingInfo{Version: Version, Hostname: host})
	case opSync:
		unix.Sync()
		return fw.writeJSON(frameResult, struct{}{})
	case opExec:
		return s.handleExec(body, fw, req)
	case opStart:
		return s.handleStart(fw, req)
	case opRead:
		return s.handleRead(fw, req)
	case opWrite:
		return s.handleWrite(body, fw, req)
	case opList:
		return s.handleList(fw, req)
	case opPty:
		return s.handlePty(body, fw, req)
	case opUntar:
		return s.handleUntar(body, fw, req)
	case opTar:
		return s.handleTar(fw, req)
	case opFork:
		// Sessions restored from the source's memory are the source's.
		s.closeSessions(sessionOf(body.conn), false)
		return s.handleForked(fw, req, received)
	case opRotate:
		return s.handleRotate(fw, req)
	case opStat, opMkdir, opMove, opRemove, opWalk:
		return s.handleFileOp(fw, req)
	case opSignal:
		return s.handleSignal(fw, req)
	case opWatch:
		return s.handleWatch(body, fw, req)
	case opAttach:
		return s.handleAttach(body, fw, req)
	}
	return fmt.Errorf("unknown op %q: %w", req.Op, errdefs.ErrNotImplemented)
}

// bufConn is a net.Conn whose reads go through a bufio.Reader.
type bufConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// signalExecs sends sig to every running exec's process group.
func (s *Server) signalExecs(sig unix.Signal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range s.execs {
		e.mu.Lock()
		if !e.exited {
			_ = unix.Kill(-e.pid, sig)
		}
		e.mu.Unlock()
	}
}
