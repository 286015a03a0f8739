package ports

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/forkbox/forkbox/errdefs"
)

// Backend resolves a sandbox's port to where requests for it go.
type Backend interface {
	// Target returns where port in sandbox id is reached, waking the
	// sandbox if it is hibernated, and marks it busy until done is called.
	// An unknown or closed sandbox is NotFound; one that cannot serve
	// (paused) is FailedPrecondition.
	Target(ctx context.Context, id string, port int) (t Target, done func(), err error)
}

// Target is where a request for a sandbox port goes.
type Target struct {
	// Addr is the host:port dialled: the sandbox's port itself, or the
	// relay's listener.
	Addr string
	// RelayToken, when set, says Addr is another forkbox preview listener
	// in front of the sandbox (its node's, behind the gateway) and is the
	// sandbox's port token there. Requests go to it in the header form
	// (RouteHeader; Host and path as the app is to see them) with
	// RelayToken in Header, and a CONNECT is passed on as a CONNECT: the
	// caller's credentials never go further than this listener.
	RelayToken string
}

// Options configure a Handler.
type Options struct {
	Keys *Keys
	// APIToken, when set, is accepted as "Authorization: Bearer <token>".
	APIToken string
	Log      *slog.Logger
	// DialTimeout bounds connecting to the sandbox's port (default 5s).
	DialTimeout time.Duration
	// TunnelIdle closes a CONNECT tunnel, an upgraded (WebSocket)
	// connection or any other connection to the listener that has moved no
	// byte for this long (default 30m).
	TunnelIdle time.Duration
	// Domain is the one below which preview host names are taken
	// ("<port>-<id>.<Domain>"; default DefaultDomain). Any other Host is
	// routed by path, or not at all.
	Domain string
	// MaxConns caps the listener's open connections (default
	// DefaultMaxConns). At the cap, a new connection closes the oldest
	// one that has not yet sent a whole request (which sends nothing
	// holds its slot for HeaderTimeout otherwise); with none, it waits.
	MaxConns int
	// HeaderTimeout closes a connection whose request's headers have not
	// all come this long after it opened or its last request ended
	// (default ReadHeaderTimeout).
	HeaderTimeout time.Duration
	// MaxUpgrades caps one sandbox's open WebSockets and tunnels together
	// (default DefaultMaxUpgrades); more are refused with 429.
	MaxUpgrades int
	// MaxSandboxConns caps the listener's connections one sandbox's
	// requests hold (default a quarter of MaxConns): a connection kept
	// alive after its sandbox's request is closed to make room for a new
	// one of that sandbox, and a request for a sandbox whose connections
	// all have a request in flight is refused with 429, its connection
	// closed.
	MaxSandboxConns int
}

// Defaults of Options.
const (
	DefaultMaxConns    = 1024
	DefaultMaxUpgrades = 64
)

// Handler proxies requests to sandbox ports.
type Handler struct {
	b      Backend
	o      Options
	proxy  *httputil.ReverseProxy
	ctx    context.Context // canceled by Close: ends upgrades and tunnels
	cancel context.CancelFunc
	wg     sync.WaitGroup // requests in flight

	mu       sync.Mutex
	upgrades map[string]int      // sandbox ID -> open WebSockets and tunnels
	conns    map[string]int      // sandbox ID -> connections it holds
	holder   map[*idleConn]*hold // connection -> the sandbox holding it
}

type targetKey struct{}

type target struct {
	Target
	route Route
	query url.Values // the request's, parsed
}

// NewHandler returns a handler over b.
func NewHandler(b Backend, o Options) *Handler {
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.DialTimeout == 0 {
		o.DialTimeout = 5 * time.Second
	}
	if o.TunnelIdle == 0 {
		o.TunnelIdle = 30 * time.Minute
	}
	if o.Domain == "" {
		o.Domain = DefaultDomain
	}
	if o.MaxConns == 0 {
		o.MaxConns = DefaultMaxConns
	}
	if o.HeaderTimeout == 0 {
		o.HeaderTimeout = ReadHeaderTimeout
	}
	if o.MaxUpgrades == 0 {
		o.MaxUpgrades = DefaultMaxUpgrades
	}
	if o.MaxSandboxConns == 0 {
		o.MaxSandboxConns = max(o.MaxConns/4, 1)
	}
	h := &Handler{b: b, o: o, upgrades: map[string]int{}, conns: map[string]int{}, holder: map[*idleConn]*hold{}}
	h.ctx, h.cancel = context.WithCancel(context.Background())
	tr := &http.Transport{
		Proxy:                  nil, // never an environment proxy: only the sandbox's address
		DialContext:            (&net.Dialer{Timeout: o.DialTimeout, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConnsPerHost:    8,
		IdleConnTimeout:        90 * time.Second,
		ResponseHeaderTimeout:  5 * time.Minute,
		MaxResponseHeaderBytes: 1 << 20,
	}
	h.proxy = &httputil.ReverseProxy{
		Transport: tr,
		Rewrite: func(pr *httputil.ProxyRequest) {
			t := pr.In.Context().Value(targetKey{}).(target)
			pr.SetXForwarded()
			u := *pr.Out.URL
			u.Scheme, u.Host = "http", t.Addr
			if p := t.route.Prefix(); p != "" {
				esc := strings.TrimPrefix(pr.In.URL.EscapedPath(), p)
				if esc == "" {
					esc = "/"
				}
				u.Path, u.RawPath = t.route.Path, esc
				if dec, err := url.PathUnescape(esc); err == nil {
					u.Path = dec
				}
			}
			pr.Out.URL = &u
			pr.Out.Host = pr.In.Host // the app sees the name it was reached by
			h.stripCredentials(pr.Out, t.query)
			if t.RelayToken != "" {
				pr.Out.Header.Set(RouteHeader, t.route.HeaderValue())
				pr.Out.Header.Set(Header, t.RelayToken)
			}
		},
		ModifyResponse: func(resp *http.Response) error {
			sanitizeResponse(resp.Header)
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			t := r.Context().Value(targetKey{}).(target)
			h.o.Log.Debug("preview proxy", "sandbox", t.route.Sandbox, "port", t.route.Port, "err", err)
			var op *net.OpError
			if errors.As(err, &op) && op.Op == "dial" {
				fail(w, http.StatusBadGateway, t.unreachable())
				return
			}
			fail(w, http.StatusBadGateway, fmt.Sprintf("port %d of sandbox %s: %v", t.route.Port, t.route.Sandbox, err))
		},
	}
	return h
}

// unreachable says that t's address does not answer.
func (t target) unreachable() string {
	if t.RelayToken != "" {
		return fmt.Sprintf("the preview listener in front of sandbox %s (%s) does not answer", t.route.Sandbox, t.Addr)
	}
	return fmt.Sprintf("nothing answers on port %d of sandbox %s", t.route.Port, t.route.Sandbox)
}

// Close ends every proxied request, WebSocket and tunnel, and waits for
// them.
func (h *Handler) Close() {
	h.cancel()
	h.wg.Wait()
}

func fail(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	fmt.Fprintln(w, "forkbox: "+msg)
}

// message is an error's text without its class's suffix.
func message(err error) string {
	s := err.Error()
	for _, c := range []error{errdefs.ErrNotFound, errdefs.ErrInvalidArgument, errdefs.ErrPermissionDenied,
		errdefs.ErrFailedPrecondition, errdefs.ErrUnavailable, errdefs.ErrResourceExhausted, errdefs.ErrDeadlineExceeded} {
		if t, ok := strings.CutSuffix(s, ": "+c.Error()); ok {
			return t
		}
	}
	return s
}

// status is the HTTP status of an error class.
func status(err error) int {
	switch {
	case errdefs.IsNotFound(err):
		return http.StatusNotFound
	case errdefs.IsInvalidArgument(err):
		return http.StatusBadRequest
	case errdefs.IsPermissionDenied(err):
		return http.StatusForbidden
	case errdefs.IsFailedPrecondition(err):
		return http.StatusConflict
	case errdefs.IsUnavailable(err), errdefs.IsResourceExhausted(err):
		return http.StatusServiceUnavailable
	case errdefs.IsDeadlineExceeded(err):
		return http.StatusGatewayTimeout
	}
	return http.StatusInternalServerError
}

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.wg.Add(1)
	defer h.wg.Done()
	if h.ctx.Err() != nil {
		fail(w, http.StatusServiceUnavailable, "the daemon is shutting down")
		return
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	stop := context.AfterFunc(h.ctx, cancel)
	defer stop()
	if c, ok := r.Context().Value(connKey{}).(*idleConn); ok {
		c.served() // no longer the first closed to make room
	}
	// Until the request is allowed and its sandbox holds the connection,
	// the answer closes it: a caller without a token (a bad route, a
	// redirect, a refusal) does not keep one of the listener's MaxConns
	// open for the idle timeout.
	w.Header().Set("Connection", "close")

	route, err := ParseRequest(r, h.o.Domain)
	if err != nil {
		fail(w, status(err), message(err))
		return
	}
	q, err := parseQuery(r.URL.RawQuery)
	if err != nil {
		fail(w, status(err), message(err))
		return
	}
	if route.Prefix() != "" && route.Path == "" && r.Method != http.MethodConnect {
		// Relative links (and the cookie's path) need the trailing slash:
		// first, with the query as it is.
		loc := route.Prefix() + "/"
		if r.URL.RawQuery != "" {
			loc += "?" + r.URL.RawQuery
		}
		http.Redirect(w, r, loc, http.StatusPermanentRedirect)
		return
	}
	v, fromQuery := h.authorize(r, route, q)
	switch v {
	case missing:
		w.Header().Set("WWW-Authenticate", `Bearer realm="forkbox preview"`)
		how := "?" + QueryParam + "=, header " + Header + " or the cookie"
		if !route.ByHost {
			how = "?" + QueryParam + "= or header " + Header + " on every request: the path form takes no cookie; browsers use the host form"
		}
		fail(w, http.StatusUnauthorized, fmt.Sprintf("sandbox %s port %d needs its port token (%s; `forkbox port %s %d` prints the URLs)",
			route.Sandbox, route.Port, how, route.Sandbox, route.Port))
		return
	case wrong:
		fail(w, http.StatusForbidden, fmt.Sprintf("the port token is not sandbox %s's", route.Sandbox))
		return
	case foreignCookie:
		fail(w, http.StatusForbidden, fmt.Sprintf("sandbox %s's preview cookie came with a request from another site's page (Origin %q): such requests must send the port token (header %s)",
			route.Sandbox, r.Header.Get("Origin"), Header))
		return
	}
	if c, ok := r.Context().Value(connKey{}).(*idleConn); ok {
		if !h.holdConn(c, route.Sandbox) {
			fail(w, http.StatusTooManyRequests, fmt.Sprintf("sandbox %s has %d requests in flight on this listener, the most one sandbox may",
				route.Sandbox, h.o.MaxSandboxConns))
			return
		}
		defer h.requestDone(c)
	}
	w.Header().Del("Connection")
	if fromQuery && route.ByHost && r.Method != http.MethodConnect {
		// A host-only cookie: the host is this sandbox port's alone.
		http.SetCookie(w, &http.Cookie{Name: CookieName, Value: h.o.Keys.Token(route.Sandbox), Path: "/",
			HttpOnly: true, SameSite: http.SameSiteLaxMode, Secure: r.TLS != nil})
		if (r.Method == http.MethodGet || r.Method == http.MethodHead) && r.Header.Get("Upgrade") == "" {
			loc := r.URL.EscapedPath()
			if rest := withoutQueryToken(r.URL.RawQuery, q); rest != "" {
				loc += "?" + rest
			}
			http.Redirect(w, r, loc, http.StatusFound)
			return
		}
	}
	if r.Method == http.MethodConnect || isUpgrade(r) {
		release, ok := h.upgradeSlot(route.Sandbox)
		if !ok {
			fail(w, http.StatusTooManyRequests, fmt.Sprintf("sandbox %s has %d WebSockets and tunnels open, the most it may: close one", route.Sandbox, h.o.MaxUpgrades))
			return
		}
		defer release()
	}
	to, done, err := h.b.Target(ctx, route.Sandbox, route.Port)
	if err != nil {
		code := status(err)
		if code == http.StatusInternalServerError {
			h.o.Log.Warn("preview: resolve sandbox port", "sandbox", route.Sandbox, "port", route.Port, "err", err)
		}
		fail(w, code, message(err))
		return
	}
	defer done()
	t := target{Target: to, route: route, query: q}
	if r.Method == http.MethodConnect {
		h.tunnel(ctx, w, r, t)
		return
	}
	h.proxy.ServeHTTP(w, r.WithContext(context.WithValue(ctx, targetKey{}, t)))
}
