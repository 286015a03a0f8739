// Package porttest holds what the daemon's and the cluster's end-to-end
// tests of preview URLs share: one request to a preview listener, in
// either URL form, waiting for a preview or a tunnel, an echo through a
// tunnel, and an upgraded connection's round trip.
package porttest

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/forkbox/forkbox/client"
)

// maxBody bounds a response body read (what a sandbox serves is untrusted).
const maxBody = 1 << 20

// Get sends one GET to the preview listener of u (dialled at the path
// URL's address): by the host form (Host header) or the path form. It does
// not follow redirects.
func Get(t testing.TB, u *client.PortURL, byHost bool, path string, hdr http.Header) (int, string, *http.Response) {
	t.Helper()
	pu, err := url.Parse(u.PathURL)
	if err != nil {
		t.Fatal(err)
	}
	target := "http://" + pu.Host + path
	if !byHost {
		target = "http://" + pu.Host + strings.TrimSuffix(pu.Path, "/") + path
	}
	req, err := http.NewRequest(http.MethodGet, target, nil)
	if err != nil {
		t.Fatal(err)
	}
	if byHost {
		req.Host = u.Host
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	c := &http.Client{Timeout: 2 * time.Minute, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("GET %s (Host %s): %v", target, req.Host, err)
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	resp.Body.Close()
	return resp.StatusCode, string(b), resp
}

// Tok is the header that carries a port token.
func Tok(token string) http.Header { return http.Header{client.PortTokenHeader: {token}} }

// UpgradeEcho sends an Upgrade request through u's listener (retrying
// while the server in the sandbox does not listen yet: 502) and checks
// that bytes after the 101 are echoed.
func UpgradeEcho(t testing.TB, u *client.PortURL) {
	t.Helper()
	pu, _ := url.Parse(u.PathURL)
	deadline := time.Now().Add(2 * time.Minute)
	for {
		c, err := net.Dial("tcp", pu.Host)
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(time.Minute))
		fmt.Fprintf(c, "GET /chat HTTP/1.1\r\nHost: %s\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n%s: %s\r\n\r\n", u.Host, client.PortTokenHeader, u.Token)
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			c.Close()
			t.Fatal(err)
		}
		if resp.StatusCode == http.StatusBadGateway && time.Now().Before(deadline) {
			c.Close()
			time.Sleep(50 * time.Millisecond) // poll interval: the server may not listen yet
			continue
		}
		if resp.StatusCode != http.StatusSwitchingProtocols {
			c.Close()
			t.Fatalf("upgrade: %s, want 101", resp.Status)
		}
		msg := "frames after the upgrade\n"
		io.WriteString(c, msg)
		got := make([]byte, len(msg))
		if _, err := io.ReadFull(br, got); err != nil || string(got) != msg {
			t.Errorf("upgraded echo: got %q (%v)", got, err)
		}
		c.Close()
		return
	}
}

// WaitPreview waits until a GET of path by the host form with hdr answers
// 200 and returns the body (the server in the sandbox may not listen yet:
// 502 until then; any other answer fails t).
func WaitPreview(t testing.TB, u *client.PortURL, path string, hdr http.Header) string {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		code, body, _ := Get(t, u, true, path, hdr)
		if code == 200 {
			return body
		}
		if code != http.StatusBadGateway || time.Now().After(deadline) {
			t.Fatalf("preview %s%s: %d %q, want 200", u.Host, path, code, body)
		}
		time.Sleep(50 * time.Millisecond) // poll interval, not a wait for an outcome
	}
}

// WaitDial opens a tunnel to u once something listens there.
func WaitDial(t testing.TB, u *client.PortURL) net.Conn {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		c, err := u.Dial(ctx)
		cancel()
		if err == nil {
			return c
		}
		if time.Now().After(deadline) {
			t.Fatalf("tunnel to %s: %v", u.Host, err)
		}
		time.Sleep(50 * time.Millisecond) // poll interval
	}
}

// EchoThrough writes msg to c and checks that the same bytes come back.
func EchoThrough(t testing.TB, c net.Conn, msg string) {
	t.Helper()
	c.SetDeadline(time.Now().Add(time.Minute))
	if _, err := io.WriteString(c, msg); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil || string(got) != msg {
		t.Fatalf("echo: got %q (%v), want %q", got, err, msg)
	}
}
