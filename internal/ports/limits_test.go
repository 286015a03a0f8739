package ports

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/websocket"
)

// TestProxyPathFormTakesNoCookie: every sandbox's path URLs share one
// origin, so there the cookie is neither set nor accepted: one sandbox's
// page cannot fetch another's path URL with that one's cookie attached.
func TestProxyPathFormTakesNoCookie(t *testing.T) {
	f := newFixture(t, "")
	tok := f.keys.Token("sb-a")
	p := fmt.Sprintf("/sandboxes/sb-a/ports/%d/p?a=1", f.port)
	resp, body := f.do(t, "GET", f.addr, p, http.Header{"Cookie": {CookieName + "=" + tok}})
	if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(body, "takes no cookie") {
		t.Errorf("path form with only the cookie: got %d %q, want 401 saying it takes no cookie", resp.StatusCode, body)
	}
	// The query token is served at once, with no cookie and no redirect,
	// and the app does not see it.
	resp, body = f.do(t, "GET", f.addr, p+"&"+QueryParam+"="+tok, nil)
	if resp.StatusCode != 200 || len(resp.Cookies()) != 0 || !strings.HasPrefix(body, "GET /p?a=1 ") || strings.Contains(body, tok) {
		t.Errorf("path form with the query token: got %d cookies %v %q, want 200, no cookie, the token stripped", resp.StatusCode, resp.Cookies(), body)
	}
	resp, _ = f.do(t, "GET", f.addr, p, http.Header{Header: {tok}})
	if resp.StatusCode != 200 || len(resp.Cookies()) != 0 {
		t.Errorf("path form with the header: got %d cookies %v", resp.StatusCode, resp.Cookies())
	}
	// The host form still takes its host-only cookie.
	resp, _ = f.do(t, "GET", f.host("sb-a"), "/p", http.Header{"Cookie": {CookieName + "=" + tok}})
	if resp.StatusCode != 200 {
		t.Errorf("host form with the cookie: got %d", resp.StatusCode)
	}
}

// TestProxySanitizesResponses: an app cannot widen a service worker's scope
// (in the path form it would capture every sandbox's pages) nor set a
// cookie for the parent domain (sent to every sandbox's host).
func TestProxySanitizesResponses(t *testing.T) {
	f := newFixture(t, "")
	tok := f.keys.Token("sb-a")
	for _, tc := range []struct{ host, path string }{
		{f.host("sb-a"), "/sw.js"},
		{f.addr, fmt.Sprintf("/sandboxes/sb-a/ports/%d/sw.js", f.port)},
	} {
		resp, body := f.do(t, "GET", tc.host, tc.path, http.Header{Header: {tok}})
		if resp.StatusCode != 200 || !strings.Contains(body, "addEventListener") {
			t.Fatalf("%s: got %d %q", tc.path, resp.StatusCode, body)
		}
		if v, ok := resp.Header["Service-Worker-Allowed"]; ok {
			t.Errorf("%s: Service-Worker-Allowed %q passed through", tc.path, v)
		}
		got := resp.Header.Values("Set-Cookie")
		want := []string{"app=1; Path=/; HttpOnly", "other=2;Secure"}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s: Set-Cookie %q, want %q (no Domain)", tc.path, got, want)
		}
	}
}

// TestProxyQueryTokenAnyEscape: the token's key is matched decoded, so an
// escaped key is stripped like a plain one (it used to reach the app, and
// its redirect pointed back at itself); a query that does not parse is
// refused.
func TestProxyQueryTokenAnyEscape(t *testing.T) {
	f := newFixture(t, "")
	tok := f.keys.Token("sb-a")
	resp, _ := f.do(t, "GET", f.host("sb-a"), "/p?forkbox%5Ftoken="+tok+"&a=1", nil)
	if resp.StatusCode != http.StatusFound || resp.Header.Get("Location") != "/p?a=1" {
		t.Errorf("escaped key: got %d to %q, want 302 to /p?a=1", resp.StatusCode, resp.Header.Get("Location"))
	}
	for _, tc := range []struct{ host, path string }{
		{f.host("sb-a"), "/p?forkbox%5Ftoken=" + tok + "&a=1"},
		{f.addr, fmt.Sprintf("/sandboxes/sb-a/ports/%d/p?forkbox%%5Ftoken=%s&a=1", f.port, tok)},
	} {
		resp, body := f.do(t, "POST", tc.host, tc.path, nil)
		if resp.StatusCode != 200 || !strings.HasPrefix(body, "POST /p?a=1 ") || strings.Contains(body, tok) {
			t.Errorf("POST %s: got %d %q, want 200 and the token stripped", tc.path, resp.StatusCode, body)
		}
	}
	for _, q := range []string{"a=%zz", "a=1;b=2", "forkbox_token=%zz" + tok} {
		resp, body := f.do(t, "GET", f.host("sb-a"), "/p?"+q, http.Header{Header: {tok}})
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, "does not parse") {
			t.Errorf("query %q: got %d %q, want 400", q, resp.StatusCode, body)
		}
	}
	if n := f.b.calls.Load(); n != 2 {
		t.Errorf("the sandbox was resolved %d times, want 2 (for the POSTs, never for a bad query)", n)
	}
}

// TestProxyHostBelowDomainOnly: a Host outside the configured domain is
// not a host-form route.
func TestProxyHostBelowDomainOnly(t *testing.T) {
	f := newFixtureWith(t, Options{Domain: "preview.test"})
	tok := f.keys.Token("sb-a")
	for _, host := range []string{f.host("sb-a"), fmt.Sprintf("%d-sb-a.evil.test", f.port), fmt.Sprintf("%d-sb-a.x.preview.test", f.port)} {
		resp, body := f.do(t, "GET", host, "/p", http.Header{Header: {tok}})
		if resp.StatusCode != http.StatusNotFound || !strings.Contains(body, "no sandbox port named") {
			t.Errorf("Host %s: got %d %q, want 404", host, resp.StatusCode, body)
		}
	}
	resp, body := f.do(t, "GET", fmt.Sprintf("%d-sb-a.Preview.Test:1", f.port), "/p", http.Header{Header: {tok}})
	if resp.StatusCode != 200 || !strings.HasPrefix(body, "GET /p?") {
		t.Errorf("below the domain: got %d %q", resp.StatusCode, body)
	}
}

// upgrade sends a WebSocket handshake for sb's /ws and returns the status
// and the connection (open if 101).
func upgrade(t *testing.T, f *fixture, sb string) (int, net.Conn) {
	t.Helper()
	c, err := net.Dial("tcp", f.addr)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(30 * time.Second))
	fmt.Fprintf(c, "GET /ws HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nOrigin: http://x/\r\n%s: %s\r\n\r\n",
		f.host(sb), Header, f.keys.Token(sb))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		c.Close()
		return resp.StatusCode, nil
	}
	c.SetDeadline(time.Time{})
	return resp.StatusCode, c
}

// TestProxyUpgradeCap: one sandbox holds at most MaxUpgrades WebSockets and
// tunnels; the next is refused, other sandboxes are not, and a closed one
// frees its slot.
func TestProxyUpgradeCap(t *testing.T) {
	f := newFixtureWith(t, Options{MaxUpgrades: 2})
	echo := tcpEcho(t)
	var open []net.Conn
	defer func() {
		for _, c := range open {
			c.Close()
		}
	}()
	code, ws := upgrade(t, f, "sb-a")
	if code != 101 {
		t.Fatalf("first WebSocket: %d", code)
	}
	open = append(open, ws)
	open = append(open, connect(t, f, fmt.Sprintf("/sandboxes/sb-a/ports/%s", portOf(echo)), f.keys.Token("sb-a"), 200))
	if code, c := upgrade(t, f, "sb-a"); code != http.StatusTooManyRequests {
		if c != nil {
			c.Close()
		}
		t.Fatalf("third upgrade of sb-a: got %d, want 429", code)
	}
	connect(t, f, fmt.Sprintf("/sandboxes/sb-a/ports/%s", portOf(echo)), f.keys.Token("sb-a"), http.StatusTooManyRequests).Close()
	code, ws = upgrade(t, f, "sb-b")
	if code != 101 {
		t.Errorf("sb-b's first WebSocket: got %d, want 101", code)
	} else {
		open = append(open, ws)
	}
	// Closing sb-a's WebSocket frees its slot once the proxy sees the end.
	open[0].Close()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for deadline := time.Now().Add(30 * time.Second); ; <-tick.C {
		code, ws := upgrade(t, f, "sb-a")
		if code == 101 {
			open = append(open, ws)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after closing a WebSocket: still %d", code)
		}
	}
}

// TestProxyIdleWebSocketClosed: a WebSocket that moves no byte for
// TunnelIdle is closed by the proxy (the app's end too: it is no longer
// marked busy).
func TestProxyIdleWebSocketClosed(t *testing.T) {
	const idle = 300 * time.Millisecond
	f := newFixtureWith(t, Options{TunnelIdle: idle})
	ws := dialWS(t, f, f.host("sb-a"), f.keys.Token("sb-a"))
	defer ws.Close()
	ws.SetDeadline(time.Now().Add(30 * time.Second))
	var got string
	// The proxy's idle clock last restarts when it moves the echo's bytes,
	// all after this: the close cannot come before sent+idle.
	sent := time.Now()
	if err := websocket.Message.Send(ws, "hi"); err != nil {
		t.Fatal(err)
	}
	if err := websocket.Message.Receive(ws, &got); err != nil || got != "hi" {
		t.Fatalf("echo: %q %v", got, err)
	}
	err := websocket.Message.Receive(ws, &got)
	var ne net.Error
	if err == nil || (errors.As(err, &ne) && ne.Timeout()) {
		t.Fatalf("an idle WebSocket: got %v, want it closed by the proxy well before the test's 30s", err)
	}
	if d := time.Since(sent); d < idle {
		t.Errorf("closed %v after the last message was sent, want at least the idle time %v", d, idle)
	}
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for deadline := time.Now().Add(30 * time.Second); f.b.inFlight.Load() != 0; <-tick.C {
		if time.Now().After(deadline) {
			t.Fatalf("the closed WebSocket is still marked busy")
		}
	}
}

// TestListenerConnCap: past MaxConns, a connection waits until another
// closes.
func TestListenerConnCap(t *testing.T) {
	f := newFixtureWith(t, Options{MaxConns: 1})
	tok := f.keys.Token("sb-a")
	req := fmt.Sprintf("GET /p HTTP/1.1\r\nHost: %s\r\n%s: %s\r\n\r\n", f.host("sb-a"), Header, tok)
	first, err := net.Dial("tcp", f.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	first.SetDeadline(time.Now().Add(30 * time.Second))
	fmt.Fprint(first, req)
	if resp, err := http.ReadResponse(bufio.NewReader(first), nil); err != nil || resp.StatusCode != 200 {
		t.Fatalf("first connection: %v %v", resp, err)
	}
	// first stays open (keep-alive): second is not served...
	second, err := net.Dial("tcp", f.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close()
	fmt.Fprint(second, req)
	br := bufio.NewReader(second)
	second.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
	if _, err := br.Peek(1); err == nil {
		t.Fatal("a second connection was served while the first held the only slot")
	}
	// ...until first closes.
	first.Close()
	second.SetReadDeadline(time.Now().Add(30 * time.Second))
	if resp, err := http.ReadResponse(br, nil); err != nil || resp.StatusCode != 200 {
		t.Fatalf("second connection after the first closed: %v %v", resp, err)
	}
}

// A refused request's connection is closed after the answer: callers
// without a token cannot hold the listener's connections idle.
func TestProxyRefusedConnClosed(t *testing.T) {
	f := newFixtureWith(t, Options{MaxConns: 1})
	for _, hdr := range []string{"", Header + ": wrong\r\n", "Cookie: " + CookieName + "=" + f.keys.Token("sb-a") + "\r\nOrigin: https://evil.example\r\n"} {
		c, err := net.Dial("tcp", f.addr)
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(time.Minute)) // against a hang
		fmt.Fprintf(c, "GET /p HTTP/1.1\r\nHost: %s\r\n%s\r\n", f.host("sb-a"), hdr)
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		if resp.StatusCode < 400 {
			t.Fatalf("%q: %d, want a refusal", hdr, resp.StatusCode)
		}
		if _, err := br.ReadByte(); err != io.EOF {
			t.Errorf("%q: after the refusal the connection stays open (%v)", hdr, err)
		}
		c.Close()
	}
	// The only slot is free again: a caller with the token is served.
	resp, _ := f.do(t, "GET", f.host("sb-a"), "/p", http.Header{Header: {f.keys.Token("sb-a")}})
	if resp.StatusCode != 200 {
		t.Errorf("with the token after the refusals: %d", resp.StatusCode)
	}
}

// At the connection cap, a new connection closes the oldest one that has
// carried no request: callers that send nothing, or their headers a byte
// at a time, no longer keep everyone out until the header timeout (an
// hour here: without this, the last request would wait that long). A
// connection that has carried a request is not closed for it.
func TestProxyFreshConnMakesRoom(t *testing.T) {
	f := newFixtureWith(t, Options{MaxConns: 3, MaxSandboxConns: 3, HeaderTimeout: time.Hour})
	dial := func() net.Conn {
		t.Helper()
		c, err := net.Dial("tcp", f.addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		c.SetDeadline(time.Now().Add(time.Minute)) // against a hang
		return c
	}
	// A connection kept alive after a request, then two that send
	// nothing but a partial header: the listener is full.
	served := dial()
	br := bufio.NewReader(served)
	if code, closed := keepAlive(t, f, served, br, f.host("sb-a"), "/p", "sb-a"); code != 200 || closed {
		t.Fatalf("first request: %d, closed %v", code, closed)
	}
	silent, trickle := dial(), dial()
	fmt.Fprint(trickle, "GET /p HTTP/1.1\r\nHo")
	if _, err := silent.Write(nil); err != nil {
		t.Fatal(err)
	}
	// Each new request's connection closes the oldest fresh one.
	for i, victim := range []net.Conn{silent, trickle} {
		c := dial()
		if code, _ := keepAlive(t, f, c, bufio.NewReader(c), f.host("sb-a"), "/p", "sb-a"); code != 200 {
			t.Fatalf("request %d at the cap: %d", i, code)
		}
		// Closed: EOF, or a reset when it closed with bytes unread; a
		// connection left open would wait for its deadline.
		if _, err := victim.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("request %d at the cap: the oldest fresh connection was not closed (%v)", i, err)
		}
	}
	// The served connection stayed, and still works.
	if code, closed := keepAlive(t, f, served, br, f.host("sb-a"), "/p", "sb-a"); code != 200 || closed {
		t.Errorf("the served connection after the others: %d, closed %v", code, closed)
	}
}

// Answers to requests that were never allowed close their connection too,
// not only refusals: an unroutable request, and the redirect that adds a
// path URL's trailing slash (sent before any token is looked at).
func TestProxyUnallowedConnClosed(t *testing.T) {
	f := newFixtureWith(t, Options{MaxConns: 1})
	for _, tc := range []struct{ host, path string }{
		{"example.com", "/"},
		{f.addr, "/sandboxes/sb-a/ports/not-a-port/"},
		{f.addr, fmt.Sprintf("/sandboxes/sb-a/ports/%d", f.port)},
	} {
		c, err := net.Dial("tcp", f.addr)
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(time.Minute)) // against a hang
		fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: %s\r\n\r\n", tc.path, tc.host)
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		if _, err := br.ReadByte(); err != io.EOF {
			t.Errorf("%s %s: after its %d answer the connection stays open (%v)", tc.host, tc.path, resp.StatusCode, err)
		}
		c.Close()
	}
}

// keepAlive sends a request for host on c, a connection kept alive, with
// sb's token, and returns the answer's status and whether the server
// closes c after it.
func keepAlive(t *testing.T, f *fixture, c net.Conn, br *bufio.Reader, host, path, sb string) (int, bool) {
	t.Helper()
	c.SetDeadline(time.Now().Add(time.Minute)) // against a hang
	fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: %s\r\n%s: %s\r\n\r\n", path, host, Header, f.keys.Token(sb))
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("request for %s: %v", sb, err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, resp.Close
}

// slowApp serves /slow, which tells arrived and answers once release is
// closed, and everything else at once.
func slowApp(t *testing.T) (port int, arrived <-chan struct{}, release func()) {
	t.Helper()
	arr, rel := make(chan struct{}, 16), make(chan struct{})
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			arr <- struct{}{}
			<-rel
		}
		fmt.Fprint(w, "ok")
	}))
	var once sync.Once
	release = func() { once.Do(func() { close(rel) }) }
	t.Cleanup(app.Close)
	t.Cleanup(release) // first: app.Close waits for its requests
	u, _ := url.Parse(app.URL)
	fmt.Sscan(portOf(u.Host), &port)
	return port, arr, release
}

// TestProxySandboxConnCap: one sandbox's requests in flight hold at most
// MaxSandboxConns of the listener's connections, so the holder of one
// link, whose app answers slowly, cannot take every connection from the
// other sandboxes'; a connection that one kept alive with no request in
// flight is closed to make room for another of its own. No timing: the
// slow app answers when told, and the listener (MaxConns) is large enough.
func TestProxySandboxConnCap(t *testing.T) {
	f := newFixtureWith(t, Options{MaxConns: 16, MaxSandboxConns: 2})
	port, arrived, release := slowApp(t)
	f.b.mu.Lock()
	f.b.addrs["sb-slow"] = f.b.addrs["sb-a"]
	f.b.mu.Unlock()
	slowHost := fmt.Sprintf("%d-sb-slow.localhost:%s", port, portOf(f.addr))
	dial := func() (net.Conn, *bufio.Reader) {
		c, err := net.Dial("tcp", f.addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		c.SetDeadline(time.Now().Add(time.Minute)) // against a hang
		return c, bufio.NewReader(c)
	}
	// Two slow requests in flight: sb-slow's share.
	c1, b1 := dial()
	c2, b2 := dial()
	for _, c := range []net.Conn{c1, c2} {
		fmt.Fprintf(c, "GET /slow HTTP/1.1\r\nHost: %s\r\n%s: %s\r\n\r\n", slowHost, Header, f.keys.Token("sb-slow"))
		select {
		case <-arrived:
		case <-time.After(time.Minute):
			t.Fatal("a slow request never reached the app")
		}
	}
	c3, b3 := dial()
	if code, closed := keepAlive(t, f, c3, b3, slowHost, "/p", "sb-slow"); code != http.StatusTooManyRequests || !closed {
		t.Errorf("a third request for sb-slow: %d (closed %v), want 429 and closed", code, closed)
	}
	c4, b4 := dial()
	if code, closed := keepAlive(t, f, c4, b4, f.host("sb-b"), "/p", "sb-b"); code != 200 || closed {
		t.Errorf("sb-b beside sb-slow's two: %d (closed %v), want 200 kept alive", code, closed)
	}
	// Answered, the two stay alive, idle: a new one takes the place of
	// one of them, which the listener closes. (The proxy answers with the
	// app's length, so the client has the answer only once the handler
	// returned, which marks the request done.)
	release()
	for i, br := range []*bufio.Reader{b1, b2} {
		resp, err := http.ReadResponse(br, nil)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("slow request %d: %v %v", i+1, resp, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	c5, b5 := dial()
	if code, closed := keepAlive(t, f, c5, b5, slowHost, "/p", "sb-slow"); code != 200 || closed {
		t.Errorf("sb-slow with its two idle: %d (closed %v), want 200 kept alive", code, closed)
	}
	// The one closed for c5 was closed before c5's answer: a request on it
	// fails at once; the other serves sb-slow still.
	evicted, served := 0, 0
	for i, c := range []net.Conn{c1, c2} {
		c.SetDeadline(time.Now().Add(time.Minute)) // against a hang
		fmt.Fprintf(c, "GET /p HTTP/1.1\r\nHost: %s\r\n%s: %s\r\n\r\n", slowHost, Header, f.keys.Token("sb-slow"))
		resp, err := http.ReadResponse([]*bufio.Reader{b1, b2}[i], nil)
		switch {
		case err != nil:
			evicted++
		case resp.StatusCode == 200:
			served++
			resp.Body.Close()
		default:
			t.Errorf("connection %d after c5: %d", i+1, resp.StatusCode)
		}
	}
	if evicted != 1 || served != 1 {
		t.Errorf("of sb-slow's two idle connections, %d were closed for the new one and %d still serve; want 1 and 1", evicted, served)
	}
}

// The holds, call by call: a request in flight is never closed for
// another; a done one's connection is; a connection moves with its
// requests' sandbox; a close drops its hold; nothing is left after.
func TestSandboxHolds(t *testing.T) {
	h := NewHandler(&fakeBackend{}, Options{Keys: NewKeys(make([]byte, 32)), MaxSandboxConns: 2})
	mk := func() *idleConn {
		a, b := net.Pipe()
		t.Cleanup(func() { a.Close(); b.Close() })
		c := &idleConn{Conn: a, idle: time.Hour}
		c.timer = time.AfterFunc(time.Hour, func() {})
		c.release = func() { h.connClosed(c) }
		return c
	}
	count := func(id string) int {
		h.mu.Lock()
		defer h.mu.Unlock()
		return h.conns[id]
	}
	a1, a2, a3 := mk(), mk(), mk()
	if !h.holdConn(a1, "a") || !h.holdConn(a2, "a") {
		t.Fatal("two requests for a refused under a cap of 2")
	}
	if h.holdConn(a3, "a") {
		t.Error("a third request for a taken while two are in flight")
	}
	h.requestDone(a1)
	if !h.holdConn(a3, "a") || !a1.closed.Load() || a2.closed.Load() || count("a") != 2 {
		t.Errorf("with a1 idle: a3 refused, or a1 closed %v, a2 closed %v, a holds %d (want a1 only, 2)", a1.closed.Load(), a2.closed.Load(), count("a"))
	}
	if !h.holdConn(a2, "b") || count("a") != 1 || count("b") != 1 {
		t.Errorf("a2 moved to b: a holds %d, b %d; want 1, 1", count("a"), count("b"))
	}
	a3.Close()
	a2.Close()
	if h.holdConn(a1, "c"); count("c") != 0 {
		t.Error("a closed connection was counted")
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.holder) != 0 || len(h.conns) != 0 {
		t.Errorf("left: holders %v, counts %v", h.holder, h.conns)
	}
}
