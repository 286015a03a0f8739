// Package porttest holds what the daemon's and the cluster's end-to-end
// tests of preview URLs share: one request to a preview listener, in
// either URL form, and an upgraded connection's round trip.
package porttest

import (
	"bufio"
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
