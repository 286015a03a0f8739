package ports

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/forkbox/forkbox/errdefs"
)

// Bounds of the preview listener.
const (
	MaxHeaderBytes    = 64 << 10
	ReadHeaderTimeout = 10 * time.Second
	IdleTimeout       = 2 * time.Minute
)

// Server is the preview listener.
type Server struct {
	h    *Handler
	srv  *http.Server
	ln   *limitListener
	done chan struct{}
}

// Listen serves h on addr until Close.
func Listen(addr string, h *Handler, log *slog.Logger) (*Server, error) {
	tl, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("preview listener %s: %v: %w", addr, err, errdefs.ErrFailedPrecondition)
	}
	ln := newLimitListener(tl, h.o.MaxConns, h.o.TunnelIdle, h.connClosed)
	s := &Server{h: h, ln: ln, done: make(chan struct{}), srv: &http.Server{
		Handler: h,
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			if ic, ok := c.(*idleConn); ok {
				ctx = context.WithValue(ctx, connKey{}, ic)
			}
			return ctx
		},
		MaxHeaderBytes:    MaxHeaderBytes,
		ReadHeaderTimeout: h.o.HeaderTimeout,
		IdleTimeout:       IdleTimeout,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}}
	go func() {
		defer close(s.done)
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("preview listener stopped", "addr", addr, "err", err)
		}
	}()
	log.Info("preview listener for sandbox ports", "addr", ln.Addr().String())
	return s, nil
}

// Addr is the address the listener is bound to.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Close stops the listener: it ends every proxied request, WebSocket and
// tunnel, and waits for them and for the serving goroutine.
func (s *Server) Close() error {
	s.h.cancel()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := s.srv.Shutdown(ctx)
	if err != nil {
		err = errors.Join(err, s.srv.Close())
	}
	s.h.Close()
	<-s.done
	return err
}
