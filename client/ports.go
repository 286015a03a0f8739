package client

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"

	"connectrpc.com/connect"

	v1 "github.com/forkbox/forkbox/api/forkbox/v1"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/errdefs/errconnect"
)

// PortTokenHeader carries a port token on a request to the preview
// listener (instead of ?forkbox_token= or the cookie).
const PortTokenHeader = "X-Forkbox-Port-Token"

// PortURL is how to reach one port of a sandbox through the daemon's
// preview listener (forkbox serve --ports). Every URL carries the token:
// it opens this sandbox's ports and nothing else, so it can be shared
// without giving API access.
type PortURL struct {
	// URL is the host form with the token: the link to share.
	URL   string `json:"url"`
	Token string `json:"token"`
	// Host is the preview host name and port, <port>-<id>.<domain>:<p>.
	Host string `json:"host"`
	// HostURL is the host form (the same as URL); PathURL the path form,
	// for non-browser clients that cannot set Host or resolve *.localhost:
	// it takes no cookie, so send the token with every request.
	HostURL string `json:"host_url"`
	PathURL string `json:"path_url"`
}

// PortURL returns the preview URLs of a port of the sandbox.
func (s *Sandbox) PortURL(ctx context.Context, port int) (*PortURL, error) {
	s.c.init()
	if port < 1 || port > 65535 {
		return nil, fmt.Errorf("port %d is not a TCP port (1-65535): %w", port, errdefs.ErrInvalidArgument)
	}
	resp, err := s.c.sbx.GetPortURL(ctx, connect.NewRequest(&v1.GetPortURLRequest{Sandbox: s.ID, Port: int32(port)}))
	if err != nil {
		return nil, errconnect.FromConnect(err)
	}
	m := resp.Msg
	return &PortURL{URL: m.Url, Token: m.Token, Host: m.Host, HostURL: m.HostUrl, PathURL: m.PathUrl}, nil
}

// URL returns the preview URL of a port of the sandbox, with its token.
func (s *Sandbox) URL(ctx context.Context, port int) (string, error) {
	u, err := s.PortURL(ctx, port)
	if err != nil {
		return "", err
	}
	return u.URL, nil
}

// Host returns the preview host name of a port of the sandbox
// ("8080-sb-….localhost:8089"); requests to it need the token too.
func (s *Sandbox) Host(ctx context.Context, port int) (string, error) {
	u, err := s.PortURL(ctx, port)
	if err != nil {
		return "", err
	}
	return u.Host, nil
}

// Dial opens a raw TCP connection to the port through the preview
// listener: an HTTP CONNECT to the path form, with the token in
// X-Forkbox-Port-Token; after the listener's 200 the connection carries the
// port's bytes both ways.
func (u *PortURL) Dial(ctx context.Context) (net.Conn, error) {
	pu, err := url.Parse(u.PathURL)
	if err != nil || pu.Host == "" {
		return nil, fmt.Errorf("path URL %q: %w", u.PathURL, errdefs.ErrInvalidArgument)
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", pu.Host)
	if err != nil {
		return nil, fmt.Errorf("preview listener %s: %v: %w", pu.Host, err, errdefs.ErrUnavailable)
	}
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	if _, err := fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n%s: %s\r\n\r\n", pu.EscapedPath(), pu.Host, PortTokenHeader, u.Token); err != nil {
		c.Close()
		return nil, fmt.Errorf("preview listener %s: %v: %w", pu.Host, err, errdefs.ErrUnavailable)
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("preview listener %s: %v: %w", pu.Host, err, errdefs.ErrUnavailable)
	}
	if resp.StatusCode != http.StatusOK {
		// (A non-2xx answer to CONNECT is read without its body.)
		var msg []byte
		if n := resp.ContentLength; n > 0 {
			msg, _ = io.ReadAll(io.LimitReader(br, min(n, 1024)))
		}
		c.Close()
		return nil, fmt.Errorf("preview listener: %s: %s: %w", resp.Status, strings.TrimSpace(string(msg)), classOfStatus(resp.StatusCode))
	}
	if br.Buffered() > 0 {
		c.Close()
		return nil, fmt.Errorf("preview listener sent bytes before the tunnel opened: %w", errdefs.ErrInternal)
	}
	return c, nil
}

func classOfStatus(code int) error {
	switch code {
	case http.StatusUnauthorized:
		return errdefs.ErrUnauthenticated
	case http.StatusForbidden:
		return errdefs.ErrPermissionDenied
	case http.StatusNotFound:
		return errdefs.ErrNotFound
	case http.StatusBadRequest:
		return errdefs.ErrInvalidArgument
	case http.StatusConflict:
		return errdefs.ErrFailedPrecondition
	case http.StatusBadGateway, http.StatusServiceUnavailable:
		return errdefs.ErrUnavailable
	}
	return errdefs.ErrUnknown
}
