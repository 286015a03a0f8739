package ports

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/forkbox/forkbox/errdefs"
)

// Where a request may carry its port token.
const (
	QueryParam  = "forkbox_token"
	Header      = "X-Forkbox-Port-Token"
	CookieName  = "forkbox_port_token"
	bearer      = "Bearer "
	maxTokenLen = 256
)

// verdict is the outcome of checking a request's credentials.
type verdict int

const (
	allowed       verdict = iota
	missing               // nothing offered: 401
	wrong                 // something offered, none of it right: 403
	foreignCookie         // only the cookie, sent by another site's page: 403
)

// authorize checks the credentials a request offers for route's sandbox:
// the API token as a bearer (when the daemon has one), or the sandbox's port
// token in the header, the query (q, the request's parsed query) or, in the
// host form only, the cookie. fromQuery says the query token was the one
// that was right (in the host form the caller turns it into a cookie).
//
// The path form never takes the cookie: every sandbox shares its origin, so
// a cookie there would be sent along with one sandbox's page's fetches of
// another's path URLs (and a token captured by one sandbox's script would
// stick). Path-form clients offer the token with each request.
func (h *Handler) authorize(r *http.Request, route Route, q url.Values) (v verdict, fromQuery bool) {
	id := route.Sandbox
	offered := false
	if a := r.Header.Get("Authorization"); h.o.APIToken != "" && strings.HasPrefix(a, bearer) {
		if equal(strings.TrimPrefix(a, bearer), h.o.APIToken) {
			return allowed, false
		}
		// Another bearer may be the app's own: neither offered nor wrong.
	}
	check := func(t string) bool {
		if t == "" {
			return false
		}
		offered = true
		return len(t) <= maxTokenLen && h.o.Keys.Check(id, t)
	}
	if check(r.Header.Get(Header)) {
		return allowed, false
	}
	if check(q.Get(QueryParam)) {
		return allowed, true
	}
	if route.ByHost {
		for _, c := range r.Cookies() {
			if c.Name == CookieName && check(c.Value) {
				if !fromSandbox(r, route, h.o.Domain) {
					return foreignCookie, false
				}
				return allowed, false
			}
		}
	}
	if offered {
		return wrong, false
	}
	return missing, false
}

// fromSandbox says whether a request that carries route's cookie came
// from route's own sandbox, or from no other page. The cookie is the
// visitor's and its browser sends it along with requests that another
// sandbox's page makes: previews under one domain are one site to the
// browser (unless the domain is on the Public Suffix List), and SameSite=Lax
// lets a same-site fetch, form, WebSocket or image carry it. A request is
// taken when:
//   - the browser says it is the page's own or the user's (Sec-Fetch-Site
//     "same-origin" or "none"), whatever its Origin (a same-origin form
//     under Referrer-Policy no-referrer says Origin "null");
//   - its Origin (every cross-origin fetch, POST and WebSocket) is a
//     preview host of the same sandbox (any of its ports);
//   - it has no Origin and is a navigation (a link followed from
//     elsewhere still opens the preview), or its Referer (an image, a
//     script, a stylesheet of another origin's page) is a preview host of
//     the same sandbox;
//   - it has neither Origin nor fetch metadata (no browser, or an old one).
func fromSandbox(r *http.Request, route Route, domain string) bool {
	site := r.Header.Get("Sec-Fetch-Site")
	if site == "same-origin" || site == "none" {
		return true
	}
	same := func(u string) bool {
		p, err := url.Parse(u)
		if err != nil || p.Host == "" {
			return false
		}
		from, ok, err := ParseHost(p.Host, domain)
		return ok && err == nil && from.Sandbox == route.Sandbox
	}
	if o := r.Header.Get("Origin"); o != "" && o != "null" {
		return same(o)
	}
	switch {
	case r.Header.Get("Sec-Fetch-Mode") == "navigate":
		return true
	case same(r.Header.Get("Referer")):
		return true
	}
	return site == "" && r.Header.Get("Origin") == ""
}

// parseQuery parses a request's query once, for the token and for
// stripping it: a query that does not parse is refused (Go's own parsing
// would drop the bad pairs, and what the proxy checked and what the app
// sees must not differ).
func parseQuery(rawQuery string) (url.Values, error) {
	q, err := url.ParseQuery(rawQuery)
	if err != nil {
		return nil, fmt.Errorf("the query does not parse: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	return q, nil
}

// withoutQueryToken returns rawQuery (parsed as q) without the token
// parameter, however it was escaped; rawQuery unchanged when it has none.
func withoutQueryToken(rawQuery string, q url.Values) string {
	if !q.Has(QueryParam) {
		return rawQuery
	}
	c := make(url.Values, len(q))
	for k, v := range q {
		if k != QueryParam {
			c[k] = v
		}
	}
	return c.Encode()
}

// stripCredentials removes forkbox's credentials (and route header) from
// a request headed for the sandbox: the app must never see the API token,
// and has no use for its port token. q is the request's parsed query.
func (h *Handler) stripCredentials(out *http.Request, q url.Values) {
	out.Header.Del(Header)
	out.Header.Del(RouteHeader)
	if a := out.Header.Get("Authorization"); h.o.APIToken != "" && strings.HasPrefix(a, bearer) && equal(strings.TrimPrefix(a, bearer), h.o.APIToken) {
		out.Header.Del("Authorization")
	}
	if cs := out.Header.Values("Cookie"); len(cs) > 0 {
		var keep []string
		for _, line := range cs {
			for _, part := range strings.Split(line, ";") {
				name, _, _ := strings.Cut(strings.TrimSpace(part), "=")
				if name != CookieName && strings.TrimSpace(part) != "" {
					keep = append(keep, strings.TrimSpace(part))
				}
			}
		}
		out.Header.Del("Cookie")
		if len(keep) > 0 {
			out.Header.Set("Cookie", strings.Join(keep, "; "))
		}
	}
	out.URL.RawQuery = withoutQueryToken(out.URL.RawQuery, q)
}
