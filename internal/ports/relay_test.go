package ports

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/websocket"

	"github.com/forkbox/forkbox/errdefs"
)

// relayBackend is a gateway's: every sandbox it knows is behind the
// node's preview listener (a fixture), reached with the node's token.
type relayBackend struct {
	node  *fixture
	known map[string]bool
	wrong bool // relay with a token that is not the node's
}

func (b *relayBackend) Target(_ context.Context, id string, port int) (Target, func(), error) {
	if !b.known[id] {
		return Target{}, nil, fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	tok := b.node.keys.Token(id)
	if b.wrong {
		tok = b.node.keys.Token("sb-b")
	}
	return Target{Addr: b.node.addr, RelayToken: tok}, func() {}, nil
}

// relayFixture is a front listener (the gateway's, its own keys and API
// token) relaying to node (a fixture: the node's listener and the app).
func relayFixture(t *testing.T) (front, node *fixture, rb *relayBackend) {
	t.Helper()
	node = newFixture(t, "node-secret")
	rb = &relayBackend{node: node, known: map[string]bool{"sb-a": true, "sb-b": true, "sb-tcp": true}}
	front = &fixture{keys: NewKeys([]byte("gateway-key-0123456789abcdef0123")), port: node.port}
	h := NewHandler(rb, Options{Keys: front.keys, APIToken: "gw-secret", TunnelIdle: time.Minute})
	srv, err := Listen("127.0.0.1:0", h, slogDiscard())
	if err != nil {
		t.Fatal(err)
	}
	front.srv, front.addr = srv, srv.Addr()
	t.Cleanup(func() { srv.Close() })
	return front, node, rb
}

// TestRelay: through a relay the app sees the request as its client sent
// it to the front (Host, path, its own Authorization), with none of
// forkbox's credentials; the front takes only its own tokens, the node
// only its own; the route header confines a request to one sandbox.
func TestRelay(t *testing.T) {
	front, node, rb := relayFixture(t)
	gwA, gwB := front.keys.Token("sb-a"), front.keys.Token("sb-b")
	nodeA := node.keys.Token("sb-a")
	viaPath := fmt.Sprintf("/sandboxes/sb-a/ports/%d/x/y?q=1", node.port)
	for _, tc := range []struct {
		name, host, path string
		hdr              http.Header
		code             int
		body             string // a substring
	}{
		{"path form", front.addr, viaPath, http.Header{Header: {gwA}}, 200,
			fmt.Sprintf(`GET /x/y?q=1 host=%s auth="" token="" cookie="" route="" fwd=%q`, front.addr, front.addr)},
		{"host form", front.host("sb-a"), "/x", http.Header{Header: {gwA}}, 200, "GET /x? host=" + front.host("sb-a") + ` `},
		{"the app's own bearer is passed on", front.host("sb-a"), "/x", http.Header{Header: {gwA}, "Authorization": {"Bearer app"}}, 200, `auth="Bearer app" token=""`},
		{"the front's API bearer, not passed on", front.host("sb-a"), "/x", http.Header{"Authorization": {"Bearer gw-secret"}}, 200, `auth="" token=""`},
		{"the node's API bearer is no token at the front", front.host("sb-a"), "/x", http.Header{"Authorization": {"Bearer node-secret"}}, 401, "needs its port token"},
		{"the node's port token is not the front's", front.host("sb-a"), "/x", http.Header{Header: {nodeA}}, 403, "not sandbox sb-a's"},
		{"another sandbox's token", front.host("sb-a"), "/x", http.Header{Header: {gwB}}, 403, "not sandbox sb-a's"},
		{"a route header for another sandbox", front.host("sb-a"), "/x", http.Header{Header: {gwA}, RouteHeader: {fmt.Sprintf("%d-sb-b", node.port)}}, 403, "not sandbox sb-b's"},
		{"two route headers", front.host("sb-a"), "/x", http.Header{Header: {gwA}, RouteHeader: {"80-sb-a", "80-sb-b"}}, 400, "want one"},
		{"a bad route header", front.host("sb-a"), "/x", http.Header{Header: {gwA}, RouteHeader: {"7077-sb-a"}}, 403, "agent"},
		{"unknown sandbox", front.host("sb-zzz"), "/x", http.Header{Header: {front.keys.Token("sb-zzz")}}, 404, "sb-zzz"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := front.do(t, "GET", tc.host, tc.path, tc.hdr)
			if resp.StatusCode != tc.code || !strings.Contains(body, tc.body) {
				t.Errorf("got %d %q, want %d containing %q", resp.StatusCode, body, tc.code, tc.body)
			}
		})
	}
	// The front's token opens nothing at the node, by any form.
	for _, hdr := range []http.Header{
		{Header: {gwA}},
		{Header: {gwA}, RouteHeader: {fmt.Sprintf("%d-sb-a", node.port)}},
		{"Authorization": {"Bearer gw-secret"}, RouteHeader: {fmt.Sprintf("%d-sb-a", node.port)}},
	} {
		if resp, body := node.do(t, "GET", node.host("sb-a"), "/x", hdr); resp.StatusCode/100 != 4 {
			t.Errorf("the front's credentials %v at the node: got %d %q, want refused", hdr, resp.StatusCode, body)
		}
	}
	// A relay token that is not the node's is refused there.
	rb.wrong = true
	if resp, body := front.do(t, "GET", front.host("sb-a"), "/x", http.Header{Header: {gwA}}); resp.StatusCode != 403 {
		t.Errorf("a wrong relay token: got %d %q, want the node's 403", resp.StatusCode, body)
	}
}

func TestRelayWebSocketAndTunnel(t *testing.T) {
	front, node, _ := relayFixture(t)
	ws := dialWS(t, front, front.host("sb-a"), front.keys.Token("sb-a"))
	defer ws.Close()
	ws.SetDeadline(time.Now().Add(30 * time.Second))
	if err := websocket.Message.Send(ws, "hello"); err != nil {
		t.Fatal(err)
	}
	var got string
	if err := websocket.Message.Receive(ws, &got); err != nil || got != "hello" {
		t.Fatalf("echo through the relay: %q %v", got, err)
	}

	echo := tcpEcho(t)
	node.b.addrs["sb-tcp"] = echo
	path := fmt.Sprintf("/sandboxes/sb-tcp/ports/%s", portOf(echo))
	tun := connect(t, front, path, front.keys.Token("sb-tcp"), 200)
	tun.SetDeadline(time.Now().Add(30 * time.Second))
	msg := strings.Repeat("ping", 50000)
	go io.WriteString(tun, msg)
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(tun, buf); err != nil || string(buf) != msg {
		t.Fatalf("echo through the relayed tunnel: %v", err)
	}
	io.WriteString(tun, "last")
	tun.(*net.TCPConn).CloseWrite()
	if rest, err := io.ReadAll(tun); err != nil || string(rest) != "last" {
		t.Errorf("after a half-close: got %q %v, want \"last\" then EOF", rest, err)
	}
	tun.Close()
	connect(t, front, path, node.keys.Token("sb-tcp"), 403).Close()
	connect(t, front, path, "", 401).Close()
	// The node's answer to a refused tunnel reaches the caller: nothing
	// listens on port 1 of the sandbox.
	c := connect(t, front, "/sandboxes/sb-a/ports/1", front.keys.Token("sb-a"), 502)
	c.Close()
}

// TestRelayConnectAnswerBounded: a relay that answers a CONNECT with
// an endless header is cut off, and the caller told.
func TestRelayConnectAnswerBounded(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		bufio.NewReader(c).ReadString('\n')
		io.WriteString(c, "HTTP/1.1 200 OK\r\n")
		for {
			if _, err := io.WriteString(c, "X-Junk: "+strings.Repeat("j", 1000)+"\r\n"); err != nil {
				return
			}
		}
	}()
	node := &fixture{addr: l.Addr().String(), keys: NewKeys([]byte("0123456789abcdef0123456789abcdef"))}
	rb := &relayBackend{node: node, known: map[string]bool{"sb-a": true}}
	front := &fixture{keys: NewKeys([]byte("gateway-key-0123456789abcdef0123"))}
	srv, err := Listen("127.0.0.1:0", NewHandler(rb, Options{Keys: front.keys}), slogDiscard())
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	front.addr = srv.Addr()
	connect(t, front, "/sandboxes/sb-a/ports/80", front.keys.Token("sb-a"), 502).Close()
	l.Close()
	<-done
}
