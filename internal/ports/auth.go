package ports

import (
	"net/http"
	"net/url"
	"strings"
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
	allowed verdict = iota
	missing         // nothing offered: 401
	wrong           // something offered, none of it right: 403
)

// authorize checks the credentials a request offers for sandbox id: the
// API token as a bearer (when the daemon has one), or the sandbox's port
// token in the header, the query or the cookie. fromQuery says the query
// token was the one that was right (the caller turns it into a cookie).
func (h *Handler) authorize(r *http.Request, id string) (v verdict, fromQuery bool) {
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
	if check(r.URL.Query().Get(QueryParam)) {
		return allowed, true
	}
	for _, c := range r.Cookies() {
		if c.Name == CookieName && check(c.Value) {
			return allowed, false
		}
	}
	if offered {
		return wrong, false
	}
	return missing, false
}

// withoutQueryToken returns rawQuery without the token parameter.
func withoutQueryToken(rawQuery string) string {
	if !strings.Contains(rawQuery, QueryParam) {
		return rawQuery
	}
	q, err := url.ParseQuery(rawQuery)
	if err != nil {
		return rawQuery
	}
	q.Del(QueryParam)
	return q.Encode()
}

// stripCredentials removes forkbox's credentials from a request headed for
// the sandbox: the app must never see the API token, and has no use for
// its port token.
func (h *Handler) stripCredentials(out *http.Request) {
	out.Header.Del(Header)
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
	out.URL.RawQuery = withoutQueryToken(out.URL.RawQuery)
}
