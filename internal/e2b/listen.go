package e2b

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/httpserve"
)

// maxHeaderBytes bounds a request's headers.
const maxHeaderBytes = 64 << 10

// Listen serves the endpoint on the TCP address addr (HTTP/1.1 and h2c)
// until Shutdown; it returns the address it listens on.
func (s *Server) Listen(addr string) (net.Addr, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("e2b endpoint: listen %s: %v: %w", addr, err, errdefs.ErrUnavailable)
	}
	s.http = httpserve.New(s, true)
	s.http.MaxHeaderBytes = maxHeaderBytes
	s.goOwned(func() {
		if err := s.http.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("e2b endpoint stopped", "err", err)
		}
	})
	s.log.Info("E2B-compatible endpoint listening (E2B_API_URL=E2B_SANDBOX_URL=http://ADDR, E2B_API_KEY=the API token)", "addr", ln.Addr().String())
	return ln.Addr(), nil
}

// Shutdown stops accepting requests, ends the streams and watchers in
// flight and waits for them.
func (s *Server) Shutdown(ctx context.Context) error {
	s.cancel() // ends process streams and watches, so Shutdown need not wait for them
	var err error
	if s.http != nil {
		err = s.http.Shutdown(ctx)
	}
	s.wg.Wait()
	return err
}
