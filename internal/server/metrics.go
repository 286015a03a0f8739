package server

import (
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"

	"connectrpc.com/connect"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/httpserve"
	"github.com/forkbox/forkbox/internal/metrics"
	"github.com/forkbox/forkbox/internal/ui"
)

// Web is what the daemon serves over HTTP beside the API: Prometheus metrics
// and the dashboard. On the API's TCP listener they are at /metrics and
// /ui/, behind the API token; MetricsAddr and UIAddr are listeners of their
// own.
type Web struct {
	// Metrics is the daemon's registry; nil serves no metrics and counts
	// nothing.
	Metrics *metrics.Metrics
	// MetricsAddr serves /metrics alone. With an API token it requires the
	// token (Prometheus: authorization.credentials); without one it must be
	// a loopback address.
	MetricsAddr string
	// UIAddr serves the dashboard at / and the API it calls; it needs the
	// API token (opening /?token=T logs a browser in).
	UIAddr string
}

func (w Web) interceptors() []connect.Interceptor {
	if w.Metrics == nil {
		return nil
	}
	return []connect.Interceptor{w.Metrics.Interceptor()}
}

// tcpHandler is the API's TCP listener: the API, /metrics and /ui/, all
// behind the token (a bearer token, or the dashboard's session cookie).
func (w Web) tcpHandler(token string, api http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/", api)
	if w.Metrics != nil {
		mux.Handle("GET /metrics", w.Metrics.Handler())
	}
	mux.Handle("GET /ui/", http.StripPrefix("/ui", ui.Handler()))
	mux.Handle("GET /ui", http.RedirectHandler("/ui/", http.StatusMovedPermanently))
	a := ui.NewAuth(token, "/ui/", "/metrics")
	return a.Login("/ui/", requireToken(a, mux))
}

// uiHandler is the dashboard's own listener: the page at /, the API under
// /forkbox.v1.*, and /metrics for its charts.
func (w Web) uiHandler(token string, api http.Handler) http.Handler {
	page := ui.Handler()
	metricsH := http.NotFoundHandler()
	if w.Metrics != nil {
		metricsH = w.Metrics.Handler()
	}
	mux := http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		switch {
		case strings.HasPrefix(r.URL.Path, "/forkbox.v1."):
			api.ServeHTTP(rw, r)
		case r.URL.Path == "/metrics":
			metricsH.ServeHTTP(rw, r)
		default:
			page.ServeHTTP(rw, r)
		}
	})
	a := ui.NewAuth(token, "/")
	return a.Login("/", requireToken(a, mux))
}

// metricsHandler is the --metrics listener.
func (w Web) metricsHandler(token string) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", w.Metrics.Handler())
	if token == "" {
		return mux
	}
	return requireToken(ui.NewAuth(token), mux)
}

// listen starts the web listeners; the caller shuts the returned servers down.
func (w Web) listen(token string, api http.Handler, log *slog.Logger) ([]*http.Server, error) {
	type l struct {
		name, addr string
		h          func() http.Handler
	}
	var ls []l
	if w.MetricsAddr != "" {
		if w.Metrics == nil {
			return nil, fmt.Errorf("--metrics without a metrics registry: %w", errdefs.ErrInvalidArgument)
		}
		if token == "" && !loopback(w.MetricsAddr) {
			return nil, fmt.Errorf("--metrics %s: a non-loopback address needs an API token (--api-token): %w", w.MetricsAddr, errdefs.ErrInvalidArgument)
		}
		ls = append(ls, l{"metrics", w.MetricsAddr, func() http.Handler { return w.metricsHandler(token) }})
	}
	if w.UIAddr != "" {
		if token == "" {
			return nil, fmt.Errorf("--ui needs an API token (--api-token or FORKBOX_API_TOKEN): %w", errdefs.ErrInvalidArgument)
		}
		ls = append(ls, l{"dashboard", w.UIAddr, func() http.Handler { return w.uiHandler(token, api) }})
	}
	var out []*http.Server
	for _, x := range ls {
		ln, err := net.Listen("tcp", x.addr)
		if err != nil {
			for _, s := range out {
				s.Close()
			}
			return nil, fmt.Errorf("listen %s: %w", x.addr, err)
		}
		s := httpserve.New(x.h(), false)
		go s.Serve(ln)
		out = append(out, s)
		log.Info("listening", "what", x.name, "addr", ln.Addr().String())
	}
	return out, nil
}

// loopback reports whether addr (host:port) names only loopback addresses.
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
