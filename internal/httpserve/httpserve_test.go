package httpserve

import (
	"bufio"
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"golang.org/x/net/http2"
)

// refuse answers every request 401, as a listener does to a caller with no
// token.
var refuse = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	http.Error(w, "no token", http.StatusUnauthorized)
})

func serve(t *testing.T, withH2C bool) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := newServer(refuse, withH2C, 200*time.Millisecond)
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

// closed waits for the server to close c (a read that ends), bounded
// against the hang this test is about.
func closed(t *testing.T, ended <-chan error) {
	t.Helper()
	select {
	case <-ended:
	case <-time.After(time.Minute):
		t.Fatal("the server still holds an idle connection after a minute (idle timeout 200 ms)")
	}
}

// A caller that sent one request over HTTP/1.1, got its refusal and keeps
// the connection open is cut off once the connection is idle.
func TestIdleHTTP1Closed(t *testing.T) {
	c, err := net.Dial("tcp", serve(t, true))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized || resp.Close {
		t.Fatalf("status %d (close %v), want a kept-alive 401", resp.StatusCode, resp.Close)
	}
	ended := make(chan error, 1)
	go func() { _, err := br.ReadByte(); ended <- err }()
	closed(t, ended)
}

// The same over HTTP/2 without TLS (h2c, prior knowledge): the server ends
// a connection with no stream open.
func TestIdleH2CClosed(t *testing.T) {
	addr := serve(t, true)
	ended := make(chan error, 1)
	tr := &http2.Transport{AllowHTTP: true, DialTLSContext: func(ctx context.Context, network, _ string, _ *tls.Config) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &watched{Conn: c, ended: ended}, nil
	}}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Get("http://" + addr + "/")
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized || resp.ProtoMajor != 2 {
		t.Fatalf("%s %d, want HTTP/2 401", resp.Proto, resp.StatusCode)
	}
	closed(t, ended)
}

// watched reports the first read that ends its connection.
type watched struct {
	net.Conn
	ended chan error
}

func (w *watched) Read(p []byte) (int, error) {
	n, err := w.Conn.Read(p)
	if err != nil { // the server's close, or the client's after its GOAWAY
		select {
		case w.ended <- err:
		default:
		}
	}
	return n, err
}
