package ui

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"mime"
	"net/http"
	"strings"
)

// CookieName is the dashboard's session cookie.
const CookieName = "forkbox_session"

// Header is the custom header the dashboard sends with every API call.
const Header = "X-Forkbox-UI"

// Auth checks the API token on a TCP listener: as a bearer token (SDKs,
// curl, Prometheus), or as the session cookie that Login sets (a browser).
//
// A cookie is sent by the browser whoever made the page, so cookie auth is
// limited to what a cross-site page cannot forge:
//   - GET and HEAD of the read-only paths (the dashboard and /metrics);
//   - API calls that carry the custom header X-Forkbox-UI or a JSON content
//     type. A cross-site form can only send form-encoded, multipart or plain
//     text bodies, and a cross-site fetch with either needs a CORS preflight,
//     which is never answered.
//
// The cookie is also SameSite=Strict and HttpOnly, and holds an HMAC of the
// token, never the token itself.
type Auth struct {
	token   string
	session string
	read    []string
}

// NewAuth returns the check for token; readPaths are the path prefixes that
// a cookie may GET (e.g. "/ui/", "/metrics").
func NewAuth(token string, readPaths ...string) *Auth {
	mac := hmac.New(sha256.New, []byte(token))
	mac.Write([]byte("forkbox dashboard session v1"))
	return &Auth{token: token, session: hex.EncodeToString(mac.Sum(nil)), read: readPaths}
}

func equal(a, b string) bool { return subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1 }

// Check reports whether r carries the token, or the session cookie on a
// request that a cross-site page cannot make.
func (a *Auth) Check(r *http.Request) bool {
	if got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
		return equal(got, a.token)
	}
	c, err := r.Cookie(CookieName)
	if err != nil || !equal(c.Value, a.session) {
		return false
	}
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		for _, p := range a.read {
			if r.URL.Path == strings.TrimSuffix(p, "/") || strings.HasPrefix(r.URL.Path, p) {
				return true
			}
		}
		return false
	case http.MethodPost:
		if r.Header.Get(Header) != "" {
			return true
		}
		mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
		return err == nil && (mt == "application/json" || mt == "application/connect+json")
	}
	return false
}

// Login wraps next: a GET of a path under page with ?token=T sets the
// session cookie and redirects to the same URL without the token, so that
// the token leaves the address bar and the history; a wrong token is the
// 401 page. Every other request goes to next.
func (a *Auth) Login(page string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		if r.Method != http.MethodGet || !q.Has("token") || !strings.HasPrefix(r.URL.Path, page) {
			next.ServeHTTP(w, r)
			return
		}
		if !equal(q.Get("token"), a.token) {
			Unauthorized(w, r)
			return
		}
		http.SetCookie(w, &http.Cookie{Name: CookieName, Value: a.session, Path: "/", HttpOnly: true,
			SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
		q.Del("token")
		u := *r.URL
		u.RawQuery = q.Encode()
		w.Header().Set("Cache-Control", "no-store")
		w.Header().Set("Referrer-Policy", "no-referrer")
		http.Redirect(w, r, u.RequestURI(), http.StatusSeeOther)
	})
}

// Unauthorized answers a request without a valid token: a page saying how
// to log in to a browser, the API's JSON error to anything else. The
// answer closes the connection (HTTP/2: a GOAWAY), so that a caller
// without the token does not keep one of the daemon's descriptors for the
// listener's idle timeout.
func Unauthorized(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Connection", "close")
	if r.Method == http.MethodGet && strings.Contains(r.Header.Get("Accept"), "text/html") {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(http.StatusUnauthorized)
		fmt.Fprint(w, unauthorizedPage)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusUnauthorized)
	fmt.Fprintln(w, `{"code":"unauthenticated","message":"missing or wrong bearer token"}`)
}

const unauthorizedPage = `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>forkbox: not logged in</title>
<style>body{font:16px system-ui,sans-serif;margin:4em auto;max-width:36em;color:#222}code{background:#eee;padding:.1em .3em}</style>
</head><body><h1>401: not logged in</h1>
<p>This forkbox dashboard needs the daemon's API token. Open it with the link
that carries the token once, <code>http://HOST:PORT/?token=TOKEN</code>
(<code>/ui/?token=TOKEN</code> on the API's TCP listener); the browser keeps a session cookie and the
token is dropped from the address.</p></body></html>
`
