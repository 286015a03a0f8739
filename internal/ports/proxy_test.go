package ports

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/websocket"

	"github.com/forkbox/forkbox/errdefs"
)

// fakeBackend maps sandbox IDs to real listeners' addresses, and counts
// requests in flight (the daemon's busy marks).
type fakeBackend struct {
	mu       sync.Mutex
	addrs    map[string]string
	errs     map[string]error
	inFlight atomic.Int32
	calls    atomic.Int32
}

func (b *fakeBackend) Target(_ context.Context, id string, port int) (Target, func(), error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.calls.Add(1)
	if err := b.errs[id]; err != nil {
		return Target{}, nil, err
	}
	addr, ok := b.addrs[id]
	if !ok {
		return Target{}, nil, fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	host, _, _ := net.SplitHostPort(addr)
	b.inFlight.Add(1)
	return Target{Addr: net.JoinHostPort(host, fmt.Sprint(port))}, func() { b.inFlight.Add(-1) }, nil
}

// echoApp answers with what it was asked: method, path, query, Host and the
// credentials it saw.
func echoApp() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/ws", websocket.Handler(func(c *websocket.Conn) { io.Copy(c, c) }))
	mux.HandleFunc("/sw.js", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Service-Worker-Allowed", "/")
		w.Header().Add("Set-Cookie", "app=1; Path=/; Domain=localhost; HttpOnly")
		w.Header().Add("Set-Cookie", "other=2;domain=.localhost;Secure")
		fmt.Fprint(w, "self.addEventListener('fetch', () => {})")
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%s %s?%s host=%s auth=%q token=%q cookie=%q route=%q fwd=%q", r.Method, r.URL.EscapedPath(), r.URL.RawQuery, r.Host,
			r.Header.Get("Authorization"), r.Header.Get(Header), r.Header.Get("Cookie"), r.Header.Get(RouteHeader), r.Header.Get("X-Forwarded-Host"))
	})
	return mux
}

type fixture struct {
	b     *fakeBackend
	keys  *Keys
	srv   *Server
	port  int // the app's port
	addr  string
	close func()
}

func newFixture(t *testing.T, apiToken string) *fixture {
	t.Helper()
	return newFixtureWith(t, Options{APIToken: apiToken, TunnelIdle: time.Minute})
}

// newFixtureWith is newFixture with the handler's options (Keys are the
// fixture's).
func newFixtureWith(t *testing.T, o Options) *fixture {
	t.Helper()
	app := httptest.NewServer(echoApp())
	t.Cleanup(app.Close)
	u, _ := url.Parse(app.URL)
	_, p, _ := net.SplitHostPort(u.Host)
	f := &fixture{b: &fakeBackend{addrs: map[string]string{"sb-a": u.Host, "sb-b": u.Host}, errs: map[string]error{
		"sb-paused": fmt.Errorf("sandbox sb-paused is paused: unpause it to reach its ports: %w", errdefs.ErrFailedPrecondition),
	}}, keys: NewKeys([]byte("0123456789abcdef0123456789abcdef"))}
	fmt.Sscan(p, &f.port)
	o.Keys = f.keys
	h := NewHandler(f.b, o)
	srv, err := Listen("127.0.0.1:0", h, slogDiscard())
	if err != nil {
		t.Fatal(err)
	}
	f.srv, f.addr = srv, srv.Addr()
	t.Cleanup(func() {
		if err := srv.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return f
}

// do sends a request to the preview listener with the given Host; it does
// not follow redirects.
func (f *fixture) do(t *testing.T, method, host, path string, hdr http.Header) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+f.addr+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = host
	for k, v := range hdr {
		req.Header[k] = v
	}
	c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }, Timeout: 30 * time.Second}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(body)
}

func (f *fixture) host(id string) string {
	return fmt.Sprintf("%d-%s.localhost:%s", f.port, id, portOf(f.addr))
}

func portOf(addr string) string { _, p, _ := net.SplitHostPort(addr); return p }

func TestProxyAccess(t *testing.T) {
	f := newFixture(t, "api-secret")
	tokA, tokB := f.keys.Token("sb-a"), f.keys.Token("sb-b")
	hostPath := "/x/y"
	viaPath := fmt.Sprintf("/sandboxes/sb-a/ports/%d/x/y", f.port)
	for _, tc := range []struct {
		name, host, path string
		hdr              http.Header
		code             int
		body             string // a substring
	}{
		{"host form, header token", f.host("sb-a"), hostPath + "?q=1", http.Header{Header: {tokA}}, 200, "GET /x/y?q=1 host=" + f.host("sb-a") + ` auth="" token="" cookie=""`},
		{"path form strips the prefix", f.addr, viaPath + "?q=1", http.Header{Header: {tokA}}, 200, "GET /x/y?q=1 host=" + f.addr},
		{"path form keeps escapes", f.addr, fmt.Sprintf("/sandboxes/sb-a/ports/%d/a%%2Fb", f.port), http.Header{Header: {tokA}}, 200, "GET /a%2Fb?"},
		{"cookie token, other cookies kept", f.host("sb-a"), hostPath, http.Header{"Cookie": {"app=1; " + CookieName + "=" + tokA + "; z=2"}}, 200, `cookie="app=1; z=2"`},
		{"API bearer, not passed on", f.host("sb-a"), hostPath, http.Header{"Authorization": {"Bearer api-secret"}}, 200, `auth=""`},
		{"the app's own bearer is passed on", f.host("sb-a"), hostPath, http.Header{"Authorization": {"Bearer app"}, Header: {tokA}}, 200, `auth="Bearer app"`},
		{"no token", f.host("sb-a"), hostPath, nil, 401, "needs its port token"},
		{"another bearer is no token", f.host("sb-a"), hostPath, http.Header{"Authorization": {"Bearer nope"}}, 401, "needs its port token"},
		{"another sandbox's token", f.host("sb-a"), hostPath, http.Header{Header: {tokB}}, 403, "not sandbox sb-a's"},
		{"another sandbox's cookie", f.host("sb-a"), hostPath, http.Header{"Cookie": {CookieName + "=" + tokB}}, 403, "not sandbox sb-a's"},
		// The cookie is the visitor's browser's, sent along with what any
		// preview's page asks for: only the sandbox's own pages use it.
		{"cookie, Origin of the same sandbox's other port", f.host("sb-a"), hostPath, http.Header{"Cookie": {CookieName + "=" + tokA}, "Origin": {"http://3000-sb-a.localhost:" + portOf(f.addr)}}, 200, "GET /x/y"},
		{"cookie, Origin of the same host", f.host("sb-a"), hostPath, http.Header{"Cookie": {CookieName + "=" + tokA}, "Origin": {"http://" + f.host("sb-a")}}, 200, "GET /x/y"},
		{"cookie, Origin of another sandbox", f.host("sb-a"), hostPath, http.Header{"Cookie": {CookieName + "=" + tokA}, "Origin": {"http://" + f.host("sb-b")}}, 403, "another site's page"},
		{"cookie, Origin of another site", f.host("sb-a"), hostPath, http.Header{"Cookie": {CookieName + "=" + tokA}, "Origin": {"https://evil.example"}}, 403, "another site's page"},
		{"cookie, Origin null", f.host("sb-a"), hostPath, http.Header{"Cookie": {CookieName + "=" + tokA}, "Origin": {"null"}}, 403, "another site's page"},
		{"cookie, Origin null of the page's own form (no-referrer)", f.host("sb-a"), hostPath, http.Header{"Cookie": {CookieName + "=" + tokA}, "Origin": {"null"}, "Sec-Fetch-Site": {"same-origin"}, "Sec-Fetch-Mode": {"navigate"}}, 200, "GET /x/y"},
		{"cookie, the same sandbox's other port's image", f.host("sb-a"), hostPath, http.Header{"Cookie": {CookieName + "=" + tokA}, "Sec-Fetch-Site": {"same-site"}, "Sec-Fetch-Mode": {"no-cors"}, "Referer": {"http://3000-sb-a.localhost:" + portOf(f.addr) + "/page"}}, 200, "GET /x/y"},
		{"cookie, another sandbox's image", f.host("sb-a"), hostPath, http.Header{"Cookie": {CookieName + "=" + tokA}, "Sec-Fetch-Site": {"same-site"}, "Sec-Fetch-Mode": {"no-cors"}, "Referer": {"http://" + f.host("sb-b") + "/page"}}, 403, "another site's page"},
		{"cookie, another sandbox's form posted with no Origin header", f.host("sb-a"), hostPath, http.Header{"Cookie": {CookieName + "=" + tokA}, "Sec-Fetch-Site": {"same-site"}, "Sec-Fetch-Mode": {"cors"}}, 403, "another site's page"},
		{"cookie, another site's image", f.host("sb-a"), hostPath, http.Header{"Cookie": {CookieName + "=" + tokA}, "Sec-Fetch-Site": {"same-site"}, "Sec-Fetch-Mode": {"no-cors"}}, 403, "another site's page"},
		{"cookie, a link followed from another site", f.host("sb-a"), hostPath, http.Header{"Cookie": {CookieName + "=" + tokA}, "Sec-Fetch-Site": {"cross-site"}, "Sec-Fetch-Mode": {"navigate"}}, 200, "GET /x/y"},
		{"cookie, the page's own fetch", f.host("sb-a"), hostPath, http.Header{"Cookie": {CookieName + "=" + tokA}, "Sec-Fetch-Site": {"same-origin"}, "Sec-Fetch-Mode": {"cors"}}, 200, "GET /x/y"},
		{"token header from another sandbox's page", f.host("sb-a"), hostPath, http.Header{Header: {tokA}, "Origin": {"http://" + f.host("sb-b")}}, 200, "GET /x/y"},
		{"an oversized token", f.host("sb-a"), hostPath, http.Header{Header: {strings.Repeat("a", 10000)}}, 403, "not sandbox"},
		{"unknown sandbox", f.host("sb-zzz"), hostPath, http.Header{Header: {f.keys.Token("sb-zzz")}}, 404, "sb-zzz"},
		{"paused sandbox", f.host("sb-paused"), hostPath, http.Header{Header: {f.keys.Token("sb-paused")}}, 409, "paused"},
		{"the agent's port", fmt.Sprintf("7077-sb-a.localhost:%s", portOf(f.addr)), hostPath, http.Header{Header: {tokA}}, 403, "agent"},
		{"port 0", "0-sb-a.localhost", hostPath, http.Header{Header: {tokA}}, 400, "not a port"},
		{"port 65536 by path", f.addr, "/sandboxes/sb-a/ports/65536/", http.Header{Header: {tokA}}, 400, "not a TCP port"},
		{"no route", f.addr, "/", nil, 404, "no sandbox port named"},
		{"path without slash", f.addr, fmt.Sprintf("/sandboxes/sb-a/ports/%d?x=1", f.port), http.Header{Header: {tokA}}, 308, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := f.do(t, "GET", tc.host, tc.path, tc.hdr)
			if resp.StatusCode != tc.code || !strings.Contains(body, tc.body) {
				t.Errorf("got %d %q, want %d containing %q", resp.StatusCode, body, tc.code, tc.body)
			}
		})
	}
	if n := f.b.inFlight.Load(); n != 0 {
		t.Errorf("%d requests still marked busy after they ended", n)
	}
}

func TestProxyQueryTokenBecomesCookie(t *testing.T) {
	f := newFixture(t, "")
	tok := f.keys.Token("sb-a")
	for _, tc := range []struct{ host, path, loc, cookiePath string }{
		{f.host("sb-a"), "/p?a=1&" + QueryParam + "=" + tok, "/p?a=1", "/"},
		{f.host("sb-a"), "/p?" + QueryParam + "=" + tok, "/p", "/"},
	} {
		resp, _ := f.do(t, "GET", tc.host, tc.path, nil)
		if resp.StatusCode != http.StatusFound || resp.Header.Get("Location") != tc.loc {
			t.Fatalf("%s: got %d to %q, want 302 to %q (the token stripped)", tc.path, resp.StatusCode, resp.Header.Get("Location"), tc.loc)
		}
		cs := resp.Cookies()
		if len(cs) != 1 || cs[0].Name != CookieName || cs[0].Value != tok || !cs[0].HttpOnly || cs[0].SameSite != http.SameSiteLaxMode || cs[0].Domain != "" || cs[0].Path != tc.cookiePath {
			t.Fatalf("cookie %+v: want HttpOnly, SameSite=Lax, host-only, path %s", cs, tc.cookiePath)
		}
		resp, body := f.do(t, "GET", tc.host, tc.loc, http.Header{"Cookie": {cs[0].Name + "=" + cs[0].Value}})
		if resp.StatusCode != 200 || !strings.Contains(body, "GET /p?") || strings.Contains(body, tok) {
			t.Errorf("with the cookie: got %d %q, want 200 and no token seen by the app", resp.StatusCode, body)
		}
	}
	// The path form without its trailing slash: first the slash (query
	// kept).
	bare := fmt.Sprintf("/sandboxes/sb-a/ports/%d", f.port)
	resp, _ := f.do(t, "GET", f.addr, bare+"?"+QueryParam+"="+tok, nil)
	if resp.StatusCode != http.StatusPermanentRedirect || resp.Header.Get("Location") != bare+"/?"+QueryParam+"="+tok {
		t.Errorf("bare path form: got %d to %q, want 308 to the slash with the query", resp.StatusCode, resp.Header.Get("Location"))
	}
	// A POST with the token in the query is served (and the query stripped).
	resp, body := f.do(t, "POST", f.host("sb-a"), "/p?"+QueryParam+"="+tok, nil)
	if resp.StatusCode != 200 || !strings.HasPrefix(body, "POST /p? ") {
		t.Errorf("POST: got %d %q", resp.StatusCode, body)
	}
	// A wrong query token is not redirected.
	resp, _ = f.do(t, "GET", f.host("sb-a"), "/p?"+QueryParam+"="+f.keys.Token("sb-b"), nil)
	if resp.StatusCode != 403 || len(resp.Cookies()) != 0 {
		t.Errorf("wrong query token: got %d, cookies %v; want 403 and none", resp.StatusCode, resp.Cookies())
	}
}

func TestProxyNothingListening(t *testing.T) {
	f := newFixture(t, "")
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	dead := portOf(l.Addr().String())
	l.Close()
	resp, body := f.do(t, "GET", fmt.Sprintf("%s-sb-a.localhost", dead), "/", http.Header{Header: {f.keys.Token("sb-a")}})
	if resp.StatusCode != http.StatusBadGateway || !strings.Contains(body, "nothing answers on port "+dead) {
		t.Errorf("got %d %q, want 502 naming port %s", resp.StatusCode, body, dead)
	}
}

// TestProxyNoSSRF: a request naming another host in its request line or
// Host never reaches it: only the backend's address for the sandbox is
// dialled.
func TestProxyNoSSRF(t *testing.T) {
	f := newFixture(t, "")
	var hit atomic.Bool
	evil := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { hit.Store(true) }))
	defer evil.Close()
	eu, _ := url.Parse(evil.URL)
	c, err := net.Dial("tcp", f.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// An absolute request-target: Go takes the Host from it.
	fmt.Fprintf(c, "GET http://%s/ HTTP/1.1\r\nHost: %d-sb-a.localhost\r\n%s: %s\r\nConnection: close\r\n\r\n", eu.Host, f.port, Header, f.keys.Token("sb-a"))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 404 || hit.Load() {
		t.Errorf("absolute URI to %s: got %d, evil reached %v; want 404 and not reached", eu.Host, resp.StatusCode, hit.Load())
	}
	// An address in place of the ID is an unknown sandbox ("127"), or no
	// route at all.
	for _, host := range []string{"80-127.0.0.1.localhost", eu.Host} {
		resp, _ := f.do(t, "GET", host, "/", http.Header{Header: {f.keys.Token("127")}})
		if resp.StatusCode != 404 || hit.Load() {
			t.Errorf("Host %s: got %d, evil reached %v", host, resp.StatusCode, hit.Load())
		}
	}
}

func TestProxyHeaderLimit(t *testing.T) {
	f := newFixture(t, "")
	resp, _ := f.do(t, "GET", f.host("sb-a"), "/", http.Header{"X-Big": {strings.Repeat("a", 2*MaxHeaderBytes)}})
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("a %d-byte header: got %d, want 431", 2*MaxHeaderBytes, resp.StatusCode)
	}
	if f.b.calls.Load() != 0 {
		t.Errorf("the sandbox was resolved for an oversized request")
	}
}

func dialWS(t *testing.T, f *fixture, host, token string) *websocket.Conn {
	t.Helper()
	cfg, err := websocket.NewConfig("ws://"+host+"/ws", "http://"+host+"/")
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		cfg.Header.Set(Header, token)
	}
	c, err := net.Dial("tcp", f.addr)
	if err != nil {
		t.Fatal(err)
	}
	ws, err := websocket.NewClient(cfg, c)
	if err != nil {
		c.Close()
		t.Fatalf("websocket through the proxy: %v", err)
	}
	return ws
}

func TestProxyWebSocket(t *testing.T) {
	f := newFixture(t, "")
	ws := dialWS(t, f, f.host("sb-a"), f.keys.Token("sb-a"))
	defer ws.Close()
	ws.SetDeadline(time.Now().Add(30 * time.Second))
	for _, msg := range []string{"hello", strings.Repeat("x", 100<<10)} {
		if err := websocket.Message.Send(ws, msg); err != nil {
			t.Fatal(err)
		}
		var got string
		for len(got) < len(msg) { // the echo may split a message into frames
			var part string
			if err := websocket.Message.Receive(ws, &part); err != nil {
				t.Fatalf("echo: %v after %d bytes", err, len(got))
			}
			got += part
		}
		if got != msg {
			t.Fatalf("echo: got %d bytes, want %q", len(got), msg[:10])
		}
	}
	if f.b.inFlight.Load() != 1 {
		t.Errorf("busy marks during a WebSocket: %d, want 1", f.b.inFlight.Load())
	}
	// Without a token the upgrade is refused.
	cfg, _ := websocket.NewConfig("ws://"+f.host("sb-a")+"/ws", "http://x/")
	c, _ := net.Dial("tcp", f.addr)
	if _, err := websocket.NewClient(cfg, c); err == nil {
		t.Error("a WebSocket without a token was accepted")
	}
	c.Close()
}

// TestProxyCloseEndsStreams: Close ends a WebSocket and a tunnel that are
// open, and returns once their handlers have.
func TestProxyCloseEndsStreams(t *testing.T) {
	f := newFixture(t, "")
	ws := dialWS(t, f, f.host("sb-a"), f.keys.Token("sb-a"))
	defer ws.Close()
	echo := tcpEcho(t)
	f.b.addrs["sb-tcp"] = echo
	tun := connect(t, f, fmt.Sprintf("/sandboxes/sb-tcp/ports/%s", portOf(echo)), f.keys.Token("sb-tcp"), 200)
	defer tun.Close()
	if err := f.srv.Close(); err != nil {
		t.Fatal(err)
	}
	if n := f.b.inFlight.Load(); n != 0 {
		t.Errorf("%d streams still busy after Close returned", n)
	}
	ws.SetDeadline(time.Now().Add(30 * time.Second))
	var got string
	if err := websocket.Message.Receive(ws, &got); err == nil {
		t.Error("the WebSocket still works after Close")
	}
	tun.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := tun.Read(make([]byte, 1)); err == nil {
		t.Error("the tunnel still works after Close")
	}
}

func tcpEcho(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { l.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() { defer wg.Done(); io.Copy(c, c); c.Close() }()
		}
	}()
	return l.Addr().String()
}

// connect opens a CONNECT tunnel to path and checks its status.
func connect(t *testing.T, f *fixture, path, token string, want int) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", f.addr)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(30 * time.Second)) // a wrong answer's body may never end
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n", path, f.addr)
	if token != "" {
		fmt.Fprintf(c, "%s: %s\r\n", Header, token)
	}
	fmt.Fprintf(c, "\r\n")
	br := bufio.NewReader(c)
	method := http.MethodConnect // a 2xx answer to CONNECT has no body
	if want != 200 {
		method = http.MethodGet
	}
	resp, err := http.ReadResponse(br, &http.Request{Method: method})
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != want {
		body, _ := io.ReadAll(resp.Body)
		t.Fatalf("CONNECT %s: got %d %q, want %d", path, resp.StatusCode, body, want)
	}
	if want == 200 && br.Buffered() != 0 {
		b, _ := br.Peek(br.Buffered())
		t.Fatalf("%d bytes after the CONNECT response: %q", br.Buffered(), b)
	}
	c.SetDeadline(time.Time{})
	return c
}

func TestProxyConnectTunnel(t *testing.T) {
	f := newFixture(t, "")
	echo := tcpEcho(t)
	f.b.addrs["sb-tcp"] = echo
	path := fmt.Sprintf("/sandboxes/sb-tcp/ports/%s", portOf(echo))
	tun := connect(t, f, path, f.keys.Token("sb-tcp"), 200)
	tun.SetDeadline(time.Now().Add(30 * time.Second))
	msg := strings.Repeat("ping", 50000)
	go io.WriteString(tun, msg)
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(tun, got); err != nil || string(got) != msg {
		t.Fatalf("echo through the tunnel: %v", err)
	}
	// A half-close passes through: the echo of the last bytes still
	// arrives after the client has finished sending.
	io.WriteString(tun, "last")
	tun.(*net.TCPConn).CloseWrite()
	if rest, err := io.ReadAll(tun); err != nil || string(rest) != "last" {
		t.Errorf("after a half-close: got %q %v, want \"last\" then EOF", rest, err)
	}
	tun.Close()
	connect(t, f, path, "", 401).Close()
	connect(t, f, path, f.keys.Token("sb-a"), 403).Close()
	connect(t, f, "/sandboxes/sb-tcp/ports/7077", f.keys.Token("sb-tcp"), 403).Close()
	// By host form too.
	c, _ := net.Dial("tcp", f.addr)
	defer c.Close()
	fmt.Fprintf(c, "CONNECT %s-sb-tcp.localhost:1 HTTP/1.1\r\nHost: %s-sb-tcp.localhost:1\r\n%s: %s\r\n\r\nhi", portOf(echo), portOf(echo), Header, f.keys.Token("sb-tcp"))
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("CONNECT by host: %v %v", resp, err)
	}
	c.SetDeadline(time.Now().Add(30 * time.Second))
	b := make([]byte, 2)
	if _, err := io.ReadFull(br, b); err != nil || string(b) != "hi" {
		t.Errorf("bytes sent with the CONNECT request: got %q %v, want \"hi\"", b, err)
	}
}

func TestBuildURLs(t *testing.T) {
	u := BuildURLs("127.0.0.1:8089", "", "sb-a", 8080, "T")
	want := URLs{URL: "http://8080-sb-a.localhost:8089/?forkbox_token=T", Token: "T", Host: "8080-sb-a.localhost:8089",
		HostURL: "http://8080-sb-a.localhost:8089/?forkbox_token=T", PathURL: "http://127.0.0.1:8089/sandboxes/sb-a/ports/8080/?forkbox_token=T"}
	if u != want {
		t.Errorf("got %+v, want %+v", u, want)
	}
	u = BuildURLs("0.0.0.0:80", "preview.example.com", "sb-a", 3000, "T")
	if u.Host != "3000-sb-a.preview.example.com:80" || u.PathURL != "http://preview.example.com:80/sandboxes/sb-a/ports/3000/?forkbox_token=T" {
		t.Errorf("with a domain: got %+v", u)
	}
	if u := BuildURLs("[::]:8089", "", "sb-a", 1, "T"); !strings.HasPrefix(u.PathURL, "http://127.0.0.1:8089/") {
		t.Errorf("unspecified address: path URL %s", u.PathURL)
	}
}
