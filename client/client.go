// Package client is the Go SDK of forkbox. The zero Client works: it talks to
// the local daemon on its default unix socket (or to FORKBOX_HOST, with
// FORKBOX_TOKEN). Every call takes a context first; errors carry their class
// (errdefs.IsNotFound(err), ...), as the daemon gave it.
package client

import (
	"context"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"

	"connectrpc.com/connect"

	"github.com/forkbox/forkbox/api/forkbox/v1/forkboxv1connect"
)

// DefaultSocket is where the daemon listens by default.
const DefaultSocket = "/run/forkbox/forkbox.sock"

// Client is a connection to a forkbox daemon. Its zero value connects to
// FORKBOX_HOST if set (unix:///path or http://host:port), else DefaultSocket.
type Client struct {
	// Socket is the daemon's unix socket path.
	Socket string
	// URL is the daemon's TCP address ("http://host:port"); it wins over Socket.
	URL string
	// Token is sent as a bearer token (required on TCP).
	Token string
	// MaxConcurrency bounds the live sandboxes this client holds (created,
	// forked, restored or resumed through it, until closed); 0 = no bound.
	// A fork of N needs N free slots; over the bound is ResourceExhausted.
	MaxConcurrency int

	slotMu sync.Mutex
	inUse  int

	once sync.Once
	sbx  forkboxv1connect.SandboxServiceClient
	// sbx2 speaks HTTP/2 (h2c on the socket or an http:// URL): bidi
	// streams (ExecPty) need it.
	sbx2   forkboxv1connect.SandboxServiceClient
	images forkboxv1connect.ImageServiceClient
	envs   forkboxv1connect.EnvironmentServiceClient
}

func (c *Client) init() {
	c.once.Do(func() {
		if c.URL == "" && c.Socket == "" {
			host := os.Getenv("FORKBOX_HOST")
			switch {
			case strings.HasPrefix(host, "unix://"):
				c.Socket = strings.TrimPrefix(host, "unix://")
			case host != "":
				c.URL = host
			default:
				c.Socket = DefaultSocket
			}
		}
		if c.Token == "" {
			c.Token = os.Getenv("FORKBOX_TOKEN")
		}
		base := c.URL
		hc := http.DefaultClient
		if base == "" {
			base = "http://forkbox"
			sock := c.Socket
			hc = &http.Client{Transport: &http.Transport{
				DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
					var d net.Dialer
					return d.DialContext(ctx, "unix", sock)
				},
				MaxIdleConnsPerHost: 16,
			}}
		}
		opts := []connect.ClientOption{connect.WithInterceptors(authInterceptor{c.Token})}
		c.sbx = forkboxv1connect.NewSandboxServiceClient(hc, base, opts...)
		c.sbx2 = forkboxv1connect.NewSandboxServiceClient(http2Client(c.Socket, c.URL), base, opts...)
		c.images = forkboxv1connect.NewImageServiceClient(hc, base, opts...)
		c.envs = forkboxv1connect.NewEnvironmentServiceClient(hc, base, opts...)
	})
}

// http2Client is an HTTP/2-only client: prior-knowledge h2c over the unix
// socket or an http:// URL (the daemon serves h2c on both), TLS for https.
func http2Client(sock, url string) *http.Client {
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	p.SetHTTP2(true)
	tr := &http.Transport{Protocols: &p, ForceAttemptHTTP2: true}
	if url == "" {
		tr.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		}
	}
	return &http.Client{Transport: tr}
}

// authInterceptor adds the bearer token to every request.
type authInterceptor struct{ token string }

func (a authInterceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if a.token != "" {
			req.Header().Set("Authorization", "Bearer "+a.token)
		}
		return next(ctx, req)
	}
}

func (a authInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		conn := next(ctx, spec)
		if a.token != "" {
			conn.RequestHeader().Set("Authorization", "Bearer "+a.token)
		}
		return conn
	}
}

func (a authInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}
