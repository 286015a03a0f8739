package ui

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
)

// server puts Login and Check in front of a handler that says "ok", the way
// the daemon's listeners do.
func server(t *testing.T) (*httptest.Server, *Auth) {
	a := NewAuth("s3cret", "/ui/", "/metrics")
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !a.Check(r) {
			Unauthorized(w, r)
			return
		}
		io.WriteString(w, "ok")
	})
	srv := httptest.NewServer(a.Login("/ui/", next))
	t.Cleanup(srv.Close)
	return srv, a
}

func noRedirect(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

func TestLogin(t *testing.T) {
	srv, a := server(t)
	c := &http.Client{CheckRedirect: noRedirect}
	resp, err := c.Get(srv.URL + "/ui/?token=s3cret&view=tree")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("login: got %d, want 303", resp.StatusCode)
	}
	if got, want := resp.Header.Get("Location"), "/ui/?view=tree"; got != want {
		t.Errorf("redirect: got %q, want %q (the token dropped, the rest kept)", got, want)
	}
	var ck *http.Cookie
	for _, c := range resp.Cookies() {
		if c.Name == CookieName {
			ck = c
		}
	}
	if ck == nil {
		t.Fatal("no session cookie")
	}
	if !ck.HttpOnly || ck.SameSite != http.SameSiteStrictMode || ck.Path != "/" {
		t.Errorf("cookie: HttpOnly %v, SameSite %v, Path %q; want HttpOnly, Strict, /", ck.HttpOnly, ck.SameSite, ck.Path)
	}
	if strings.Contains(ck.Value, "s3cret") || ck.Value != a.session {
		t.Errorf("cookie value %q: want the session HMAC, never the token", ck.Value)
	}

	resp, err = c.Get(srv.URL + "/ui/?token=wrong")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized || len(resp.Cookies()) != 0 {
		t.Errorf("wrong token: got %d with %d cookies, want 401 and none", resp.StatusCode, len(resp.Cookies()))
	}
}

func TestCheck(t *testing.T) {
	srv, a := server(t)
	session := &http.Cookie{Name: CookieName, Value: a.session}
	for _, c := range []struct {
		name, method, path, ctype string
		header                    map[string]string
		cookie                    *http.Cookie
		body                      string
		want                      int
	}{
		{name: "nothing", method: "GET", path: "/ui/", want: 401},
		{name: "bearer", method: "POST", path: "/forkbox.v1.SandboxService/ListSandboxes", ctype: "application/x-www-form-urlencoded",
			header: map[string]string{"Authorization": "Bearer s3cret"}, want: 200},
		{name: "wrong bearer, good cookie", method: "GET", path: "/ui/", cookie: session,
			header: map[string]string{"Authorization": "Bearer nope"}, want: 401},
		{name: "cookie page", method: "GET", path: "/ui/app.js", cookie: session, want: 200},
		{name: "cookie metrics", method: "GET", path: "/metrics", cookie: session, want: 200},
		{name: "cookie GET of the API", method: "GET", path: "/forkbox.v1.SandboxService/ListSandboxes", cookie: session, want: 401},
		{name: "cookie JSON", method: "POST", path: "/forkbox.v1.SandboxService/ListSandboxes", ctype: "application/json", cookie: session, body: "{}", want: 200},
		{name: "cookie custom header", method: "POST", path: "/forkbox.v1.SandboxService/ListSandboxes", ctype: "text/plain",
			header: map[string]string{Header: "1"}, cookie: session, want: 200},
		{name: "cookie form post (CSRF)", method: "POST", path: "/forkbox.v1.SandboxService/DeleteSandbox", ctype: "application/x-www-form-urlencoded",
			cookie: session, body: url.Values{"sandbox": {"x"}}.Encode(), want: 401},
		{name: "cookie multipart", method: "POST", path: "/forkbox.v1.SandboxService/DeleteSandbox", ctype: "multipart/form-data; boundary=x", cookie: session, want: 401},
		{name: "cookie text/plain", method: "POST", path: "/forkbox.v1.SandboxService/DeleteSandbox", ctype: "text/plain", cookie: session, body: "{}", want: 401},
		{name: "forged cookie", method: "POST", path: "/forkbox.v1.SandboxService/ListSandboxes", ctype: "application/json",
			cookie: &http.Cookie{Name: CookieName, Value: "s3cret"}, want: 401},
	} {
		req, err := http.NewRequest(c.method, srv.URL+c.path, strings.NewReader(c.body))
		if err != nil {
			t.Fatal(err)
		}
		if c.ctype != "" {
			req.Header.Set("Content-Type", c.ctype)
		}
		for k, v := range c.header {
			req.Header.Set(k, v)
		}
		if c.cookie != nil {
			req.AddCookie(c.cookie)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != c.want {
			t.Errorf("%s: got %d, want %d", c.name, resp.StatusCode, c.want)
		}
	}
}

func TestUnauthorizedPage(t *testing.T) {
	srv, _ := server(t)
	req, _ := http.NewRequest("GET", srv.URL+"/ui/", nil)
	req.Header.Set("Accept", "text/html,application/xhtml+xml")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 401 || !strings.Contains(resp.Header.Get("Content-Type"), "text/html") || !strings.Contains(string(body), "?token=") {
		t.Errorf("browser without a token: got %d %q, want the 401 page saying how to log in", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
}

func TestAssetsEmbedded(t *testing.T) {
	srv := httptest.NewServer(Handler())
	defer srv.Close()
	for _, p := range []string{"/", "/app.js", "/app.css"} {
		resp, err := http.Get(srv.URL + p)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.Header.Get("Content-Security-Policy") == "" {
			t.Errorf("%s: got %d (CSP %q), want 200 with a CSP", p, resp.StatusCode, resp.Header.Get("Content-Security-Policy"))
		}
	}
}
