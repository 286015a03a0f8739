// Package server serves the forkbox v1 API (Connect, over HTTP/1.1 and h2c)
// in front of the daemon. It is the one place where error classes become
// Connect codes, and where the optional TCP listener's bearer token is
// checked.
package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime/debug"
	"time"

	"connectrpc.com/connect"

	"github.com/forkbox/forkbox/api/forkbox/v1/forkboxv1connect"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/errdefs/errconnect"
	"github.com/forkbox/forkbox/internal/daemon"
	"github.com/forkbox/forkbox/internal/httpserve"
	"github.com/forkbox/forkbox/internal/ui"
)

// MaxRequestBytes bounds one request message.
const MaxRequestBytes = 32 << 20

// Handler returns the HTTP handler of the API; extra interceptors run inside
// the one that converts error classes to Connect codes.
func Handler(d *daemon.Daemon, log *slog.Logger, extra ...connect.Interceptor) http.Handler {
	opts := []connect.HandlerOption{
		connect.WithReadMaxBytes(MaxRequestBytes),
		connect.WithInterceptors(append([]connect.Interceptor{errconnect.Interceptor(log)}, extra...)...),
		// A bug must cost one request an Internal error, not the daemon.
		connect.WithRecover(func(ctx context.Context, spec connect.Spec, _ http.Header, p any) error {
			log.Error("panic in handler", "procedure", spec.Procedure, "panic", p, "stack", string(debug.Stack()))
			return connect.NewError(connect.CodeInternal, fmt.Errorf("internal error in %s (see the daemon log)", spec.Procedure))
		}),
	}
	mux := http.NewServeMux()
	mux.Handle(forkboxv1connect.NewSandboxServiceHandler(&sandboxes{d: d}, opts...))
	mux.Handle(forkboxv1connect.NewImageServiceHandler(&images{d: d}, opts...))
	mux.Handle(forkboxv1connect.NewEnvironmentServiceHandler(&environments{d: d}, opts...))
	return withStreamControl(forkboxv1connect.SandboxServiceExecPtyProcedure, mux)
}

// Server is the API server: a unix socket, and optionally TCP with a token.
type Server struct {
	srv  *http.Server
	tcp  *http.Server
	web  []*http.Server
	log  *slog.Logger
	sock string
}

// Listen starts serving on the unix socket path and, if tcpAddr is set, on
// TCP, where every request must carry "Authorization: Bearer <token>" (or
// the dashboard's session cookie, see ui.Auth); web adds metrics and the
// dashboard.
func Listen(d *daemon.Daemon, socket, tcpAddr, token string, log *slog.Logger, web Web) (*Server, error) {
	h := Handler(d, log, web.interceptors()...)
	s := &Server{log: log, sock: socket}
	if err := os.MkdirAll(filepath.Dir(socket), 0o755); err != nil {
		return nil, err
	}
	// Another daemon answering on the socket keeps it: two daemons must not
	// share a state.
	if c, err := net.DialTimeout("unix", socket, time.Second); err == nil {
		c.Close()
		return nil, fmt.Errorf("a daemon is already listening on %s: %w", socket, errdefs.ErrAlreadyExists)
	}
	_ = os.Remove(socket)
	ul, err := net.Listen("unix", socket)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", socket, err)
	}
	if err := os.Chmod(socket, 0o660); err != nil {
		ul.Close()
		return nil, err
	}
	s.srv = httpserve.New(h, true)
	go s.srv.Serve(ul)
	if tcpAddr != "" {
		if token == "" {
			s.srv.Close()
			return nil, fmt.Errorf("a TCP listener needs a token (--api-token or FORKBOX_API_TOKEN): %w", errdefs.ErrInvalidArgument)
		}
		tl, err := net.Listen("tcp", tcpAddr)
		if err != nil {
			s.srv.Close()
			return nil, fmt.Errorf("listen %s: %w", tcpAddr, err)
		}
		s.tcp = httpserve.New(web.tcpHandler(token, h), true)
		go s.tcp.Serve(tl)
		log.Info("API listening on TCP (token required)", "addr", tl.Addr().String())
	}
	if s.web, err = web.listen(token, h, log); err != nil {
		s.srv.Close()
		if s.tcp != nil {
			s.tcp.Close()
		}
		return nil, err
	}
	log.Info("API listening", "socket", socket)
	return s, nil
}

// Shutdown stops accepting requests and waits for those in flight.
func (s *Server) Shutdown(ctx context.Context) error {
	err := s.srv.Shutdown(ctx)
	if s.tcp != nil {
		err = errors.Join(err, s.tcp.Shutdown(ctx))
	}
	for _, w := range s.web {
		err = errors.Join(err, w.Shutdown(ctx))
	}
	os.Remove(s.sock)
	return err
}

func requireToken(a *ui.Auth, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !a.Check(r) {
			ui.Unauthorized(w, r)
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), remoteKey{}, true)))
	})
}

type remoteKey struct{}

// remote reports whether a request came over TCP (not the local socket).
func remote(ctx context.Context) bool { return ctx.Value(remoteKey{}) != nil }
