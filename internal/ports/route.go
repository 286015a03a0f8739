package ports

import (
	"fmt"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"

	"github.com/forkbox/forkbox/errdefs"
)

// AgentPort is the in-sandbox agent's port: never exposed (it would hand
// out exec to whoever holds a preview link).
const AgentPort = 7077

// PathPrefix starts the path form of a route.
const PathPrefix = "/sandboxes/"

// RouteHeader names a request's route as "<port>-<sandbox id>" (the
// header form), ahead of its Host and path, which go to the app as they
// came: a preview listener in front of another (the gateway's, relaying to
// a node's) sends it, so that the app sees the Host its client used. It
// routes like the path form (any client may send it; the token decides)
// and, like it, takes no cookie.
const RouteHeader = "X-Forkbox-Port-Route"

// Route is where a request goes: a sandbox, one of its ports, and the path
// to ask it for.
type Route struct {
	Sandbox string
	Port    int
	// Path is the request path with the route prefix stripped (path form)
	// or unchanged (host form).
	Path string
	// ByHost says the route came from the Host header; ByHeader from
	// RouteHeader.
	ByHost, ByHeader bool
}

// Prefix is the path that the path form strips ("" for the host and
// header forms).
func (r Route) Prefix() string {
	if r.ByHost || r.ByHeader {
		return ""
	}
	return r.pathPrefix()
}

// pathPrefix is the route's path form without the trailing slash.
func (r Route) pathPrefix() string {
	return fmt.Sprintf("%s%s/ports/%d", PathPrefix, r.Sandbox, r.Port)
}

// idRE is a sandbox ID as it can appear in a DNS label.
var idRE = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)

// CheckPort checks that port may be proxied to.
func CheckPort(port int) error {
	if port < 1 || port > 65535 {
		return fmt.Errorf("port %d is not a TCP port (1-65535): %w", port, errdefs.ErrInvalidArgument)
	}
	if port == AgentPort {
		return fmt.Errorf("port %d is the forkbox agent's and cannot be exposed: %w", port, errdefs.ErrPermissionDenied)
	}
	return nil
}

// parsePort parses a decimal port without sign, spaces or leading zeros.
func parsePort(s string) (int, error) {
	if s == "" || len(s) > 5 || (s[0] == '0') || strings.TrimLeft(s, "0123456789") != "" {
		return 0, fmt.Errorf("%q is not a port number: %w", s, errdefs.ErrInvalidArgument)
	}
	n, _ := strconv.Atoi(s)
	return n, CheckPort(n)
}

// ParseHost parses the host form "<port>-<id>.<domain>[:port]" (domain ""
// is DefaultDomain). ok is false when host is not of that form, below that
// domain (the request may use the path form); err is set when it is but
// names a bad port.
func ParseHost(host, domain string) (r Route, ok bool, err error) {
	if h, _, serr := net.SplitHostPort(host); serr == nil {
		host = h
	}
	if domain == "" {
		domain = DefaultDomain
	}
	host = strings.ToLower(host)
	label, rest, found := strings.Cut(host, ".")
	if !found || rest == "" || rest != strings.ToLower(strings.TrimSuffix(domain, ".")) {
		return Route{}, false, nil
	}
	p, id, found := strings.Cut(label, "-")
	if !found || p == "" || !idRE.MatchString(id) || strings.TrimLeft(p, "0123456789") != "" {
		return Route{}, false, nil
	}
	port, err := parsePort(p)
	if err != nil {
		return Route{}, true, err
	}
	return Route{Sandbox: id, Port: port, ByHost: true}, true, nil
}

// ParsePath parses the path form "/sandboxes/<id>/ports/<port>[/rest]".
// ok is false when path is not of that form.
func ParsePath(path string) (r Route, ok bool, err error) {
	rest, found := strings.CutPrefix(path, PathPrefix)
	if !found {
		return Route{}, false, nil
	}
	id, rest, _ := strings.Cut(rest, "/")
	rest, found = strings.CutPrefix(rest, "ports/")
	if !found || !idRE.MatchString(id) {
		return Route{}, false, nil
	}
	p, tail, slash := strings.Cut(rest, "/")
	port, err := parsePort(p)
	if err != nil {
		return Route{}, true, err
	}
	r = Route{Sandbox: id, Port: port}
	if slash {
		r.Path = "/" + tail
	}
	return r, true, nil
}

// ParseHeader parses the header form "<port>-<id>" (RouteHeader).
func ParseHeader(v string) (Route, error) {
	p, id, found := strings.Cut(v, "-")
	if !found || !idRE.MatchString(id) {
		return Route{}, fmt.Errorf("%s %q: want <port>-<sandbox id>: %w", RouteHeader, v, errdefs.ErrInvalidArgument)
	}
	port, err := parsePort(p)
	if err != nil {
		return Route{}, err
	}
	return Route{Sandbox: id, Port: port, ByHeader: true}, nil
}

// HeaderValue is route's RouteHeader value.
func (r Route) HeaderValue() string { return fmt.Sprintf("%d-%s", r.Port, r.Sandbox) }

// ParseRequest finds the route of a request: the header form first (the
// path unchanged), then Parse.
func ParseRequest(r *http.Request, domain string) (Route, error) {
	if vs := r.Header.Values(RouteHeader); len(vs) > 0 {
		if len(vs) > 1 {
			return Route{}, fmt.Errorf("%d %s headers: want one: %w", len(vs), RouteHeader, errdefs.ErrInvalidArgument)
		}
		rt, err := ParseHeader(vs[0])
		rt.Path = r.URL.Path
		return rt, err
	}
	return Parse(r.Host, domain, r.URL.Path)
}

// Parse finds the route of a request: the host form below domain first,
// then the path form.
func Parse(host, domain, path string) (Route, error) {
	r, ok, err := ParseHost(host, domain)
	if err != nil {
		return Route{}, err
	}
	if ok {
		r.Path = path
		return r, nil
	}
	r, ok, err = ParsePath(path)
	if err != nil {
		return Route{}, err
	}
	if !ok {
		return Route{}, fmt.Errorf("no sandbox port named: use Host <port>-<sandbox>.<domain> or path /sandboxes/<sandbox>/ports/<port>/: %w", errdefs.ErrNotFound)
	}
	return r, nil
}
