package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/internal/porttest"
)

// upgradeScript answers one HTTP upgrade with 101 and then echoes: an
// upgrade round trip (what a WebSocket does first) built from busybox.
const upgradeScript = `#!/bin/sh
while IFS= read -r l; do [ ${#l} -le 1 ] && break; done
printf 'HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n'
exec cat
`

// serveInSandbox starts, in sb, httpd on 8080 serving body, a TCP echo on
// 9000 and the upgrade echo on 9001.
func serveInSandbox(t *testing.T, sb *client.Sandbox, body string) {
	t.Helper()
	ctx := context.Background()
	if err := sb.WriteFile(ctx, "/up.sh", []byte(upgradeScript), 0o755); err != nil {
		t.Fatal(err)
	}
	mustSh(t, sb, fmt.Sprintf("mkdir -p /www && echo %s > /www/index.html", body))
	for _, cmd := range []string{"httpd -f -p 8080 -h /www", "nc -ll -p 9000 -e cat", "nc -ll -p 9001 -e /up.sh"} {
		if _, err := sb.Start(ctx, client.ExecOptions{Shell: cmd}); err != nil {
			t.Fatalf("start %s: %v", cmd, err)
		}
	}
}

// preview, tok and upgradeEcho are shared with the cluster's tests.
var (
	preview     = porttest.Get
	tok         = porttest.Tok
	upgradeEcho = porttest.UpgradeEcho
	waitDial    = porttest.WaitDial
	echoThrough = porttest.EchoThrough
)

// waitPreview waits until a GET of the port with its token answers 200.
func waitPreview(t *testing.T, u *client.PortURL) string {
	t.Helper()
	return porttest.WaitPreview(t, u, "/index.html", tok(u.Token))
}

// TestPorts: a sandbox's HTTP server, TCP echo and an upgrade round trip
// reached through the preview listener with the sandbox's token, refused
// without it or with another sandbox's; a fork child at its own URL with its
// own state; a closed sandbox is 404.
func TestPorts(t *testing.T) {
	withDaemonFlags(t, "--ports", "127.0.0.1:0")
	forEachRuntime(t, func(t *testing.T) {
		ctx := context.Background()
		sb := newSandbox(t, clientOpts())
		serveInSandbox(t, sb, "served-by-parent")
		u, err := sb.PortURL(ctx, 8080)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(u.URL, "http://8080-"+sb.ID+".localhost:") || !strings.Contains(u.URL, "forkbox_token="+u.Token) || u.URL != u.HostURL {
			t.Fatalf("URLs %+v", u)
		}
		if body := waitPreview(t, u); body != "served-by-parent\n" {
			t.Errorf("host form: body %q", body)
		}
		if code, body, _ := preview(t, u, false, "/index.html", tok(u.Token)); code != 200 || body != "served-by-parent\n" {
			t.Errorf("path form: %d %q", code, body)
		}
		if code, body, _ := preview(t, u, true, "/index.html", nil); code != http.StatusUnauthorized || !strings.Contains(body, "port token") {
			t.Errorf("without a token: %d %q, want 401", code, body)
		}
		// The shared link: the query token becomes a cookie, the query goes.
		code, _, resp := preview(t, u, true, "/index.html?forkbox_token="+u.Token, nil)
		if code != http.StatusFound || resp.Header.Get("Location") != "/index.html" || len(resp.Cookies()) != 1 {
			t.Fatalf("link with the token: %d to %q, cookies %v", code, resp.Header.Get("Location"), resp.Cookies())
		}
		ck := resp.Cookies()[0]
		if code, body, _ := preview(t, u, true, "/index.html", http.Header{"Cookie": {ck.Name + "=" + ck.Value}}); code != 200 || body != "served-by-parent\n" {
			t.Errorf("with the cookie: %d %q", code, body)
		}
		// Ports nothing listens on, and the agent's.
		u81, err := sb.PortURL(ctx, 8081)
		if err != nil {
			t.Fatal(err)
		}
		if code, body, _ := preview(t, u81, true, "/", tok(u81.Token)); code != http.StatusBadGateway || !strings.Contains(body, "port 8081") {
			t.Errorf("port 8081: %d %q, want 502 naming the port", code, body)
		}
		if _, err := sb.PortURL(ctx, 7077); err == nil {
			t.Error("GetPortURL gave a URL for the agent's port")
		}
		agentHost := *u
		agentHost.Host = strings.Replace(u.Host, "8080-", "7077-", 1)
		if code, _, _ := preview(t, &agentHost, true, "/", tok(u.Token)); code != http.StatusForbidden {
			t.Errorf("the agent's port: %d, want 403", code)
		}

		// Raw TCP through a CONNECT tunnel.
		u9000, err := sb.PortURL(ctx, 9000)
		if err != nil {
			t.Fatal(err)
		}
		c := waitDial(t, u9000)
		echoThrough(t, c, "ping through the tunnel\n")
		c.Close()

		// An upgrade round trip (the first step of a WebSocket) on 9001.
		u9001, err := sb.PortURL(ctx, 9001)
		if err != nil {
			t.Fatal(err)
		}
		upgradeEcho(t, u9001)

		// The CLI prints the same URLs, and forwards a local port.
		out, err := exec.Command(env.bin, "--host", "unix://"+env.socket, "port", sb.ID, "8080", "--json").Output()
		var cli client.PortURL
		if err != nil || json.Unmarshal(out, &cli) != nil || cli != *u {
			t.Errorf("forkbox port --json: %v %s, want %+v", err, out, u)
		}
		cliForward(t, sb.ID)

		// A fork child: its own URL and token, its own state.
		res, err := sb.Fork(ctx, client.ForkOptions{Tag: "ports", Count: 1})
		if err != nil {
			t.Fatal(err)
		}
		kids := res.Sandboxes()
		closeAll(t, kids)
		if len(kids) != 1 {
			t.Fatalf("fork: %+v", res.Children)
		}
		kid := kids[0]
		serveInSandbox(t, kid, "served-by-child")
		ku, err := kid.PortURL(ctx, 8080)
		if err != nil {
			t.Fatal(err)
		}
		if ku.Token == u.Token || ku.Host == u.Host {
			t.Fatalf("the child shares the parent's URL: %+v", ku)
		}
		if body := waitPreview(t, ku); body != "served-by-child\n" {
			t.Errorf("child: body %q", body)
		}
		if code, _, _ := preview(t, ku, true, "/index.html", tok(u.Token)); code != http.StatusForbidden {
			t.Errorf("the parent's token on the child: %d, want 403", code)
		}
		if code, _, _ := preview(t, u, true, "/index.html", tok(ku.Token)); code != http.StatusForbidden {
			t.Errorf("the child's token on the parent: %d, want 403", code)
		}
		if body := waitPreview(t, u); body != "served-by-parent\n" {
			t.Errorf("parent after the fork: body %q", body)
		}
		// Closed: 404 (the token is still right).
		if err := kid.Close(ctx); err != nil {
			t.Fatal(err)
		}
		if code, body, _ := preview(t, ku, true, "/index.html", tok(ku.Token)); code != http.StatusNotFound {
			t.Errorf("closed child: %d %q, want 404", code, body)
		}
	})
}

// cliForward runs `forkbox port SB 9000 --forward` and echoes through the
// local port it opens.
func cliForward(t *testing.T, id string) {
	t.Helper()
	addr := freeAddr(t)
	cmd := exec.Command(env.bin, "--host", "unix://"+env.socket, "port", id, "9000", "--forward", addr)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Signal(os.Interrupt)
		if err := cmd.Wait(); err != nil {
			t.Errorf("forkbox port --forward: %v\n%s", err, stderr.String())
		}
	}()
	deadline := time.Now().Add(time.Minute)
	for {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			echoThrough(t, c, "through the CLI\n")
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("forward %s: %v\n%s", addr, err, stderr.String())
		}
		time.Sleep(50 * time.Millisecond) // poll interval: the CLI may not listen yet
	}
}

// TestPortsInBrowser opens a preview link in headless Chromium: the
// *.localhost name resolves, the query token becomes the cookie, the
// redirect without it is served.
func TestPortsInBrowser(t *testing.T) {
	browser := chromium(t)
	withDaemonFlags(t, "--ports", "127.0.0.1:0")
	ctx := context.Background()
	sb := newSandbox(t, clientOpts())
	serveInSandbox(t, sb, "seen-by-a-browser")
	u, err := sb.PortURL(ctx, 8080)
	if err != nil {
		t.Fatal(err)
	}
	waitPreview(t, u)
	bctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(bctx, browser, "--headless", "--no-sandbox", "--disable-gpu",
		"--user-data-dir="+t.TempDir(), "--dump-dom", u.URL+"&x=1").Output()
	if err != nil || !strings.Contains(string(out), "seen-by-a-browser") {
		t.Fatalf("chromium at %s: %v\n%s", u.URL, err, out)
	}
}

// TestPortsWakeAndPause: a request to a hibernated gVisor sandbox wakes it
// and is served; a paused sandbox answers 409.
func TestPortsWakeAndPause(t *testing.T) {
	withDaemonFlags(t, "--ports", "127.0.0.1:0")
	ctx := context.Background()
	sb := newSandbox(t, clientOpts()) // gVisor: memory checkpoints
	serveInSandbox(t, sb, "awake")
	u, err := sb.PortURL(ctx, 8080)
	if err != nil {
		t.Fatal(err)
	}
	waitPreview(t, u)
	if err := sb.Hibernate(ctx); err != nil {
		t.Fatal(err)
	}
	if info, _ := env.c.Sandbox(ctx, sb.ID); info.Info.State != "hibernated" {
		t.Fatalf("state %s after hibernate", info.Info.State)
	}
	if code, body, _ := preview(t, u, true, "/index.html", tok(u.Token)); code != 200 || body != "awake\n" {
		t.Errorf("request to the hibernated sandbox: %d %q, want 200 \"awake\"", code, body)
	}
	if info, _ := env.c.Sandbox(ctx, sb.ID); info.Info.State != "running" {
		t.Errorf("state %s after the request, want running", info.Info.State)
	}
	// Again, with requests in parallel (a browser's page and its assets):
	// one wake, every request served.
	if err := sb.Hibernate(ctx); err != nil {
		t.Fatal(err)
	}
	pu, _ := url.Parse(u.PathURL)
	errs := make(chan error, 6)
	for range 6 {
		go func() {
			req, _ := http.NewRequest(http.MethodGet, "http://"+pu.Host+"/index.html", nil)
			req.Host = u.Host
			req.Header.Set(client.PortTokenHeader, u.Token)
			resp, err := (&http.Client{Timeout: 2 * time.Minute}).Do(req)
			if err != nil {
				errs <- err
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || string(b) != "awake\n" {
				err = fmt.Errorf("%d %q", resp.StatusCode, b)
			}
			errs <- err
		}()
	}
	for range 6 {
		if err := <-errs; err != nil {
			t.Errorf("parallel request to the hibernated sandbox: %v", err)
		}
	}
	if evs, err := sb.Events(ctx); err == nil {
		woken := 0
		for _, e := range evs {
			if e.Type == "sandbox.woken" {
				woken++
			}
		}
		if woken != 2 {
			t.Errorf("%d wakes for two hibernations", woken)
		}
	}
	if err := sb.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	if code, body, _ := preview(t, u, true, "/index.html", tok(u.Token)); code != http.StatusConflict || !strings.Contains(body, "paused") {
		t.Errorf("paused: %d %q, want 409 saying paused", code, body)
	}
	if err := sb.Unpause(ctx); err != nil {
		t.Fatal(err)
	}
	if code, _, _ := preview(t, u, true, "/index.html", tok(u.Token)); code != 200 {
		t.Errorf("after unpause: %d", code)
	}
	// A daemon restart keeps the token (the listener's port is a new one:
	// it was :0).
	restartDaemon(t, syscall.SIGTERM)
	again, err := sb.PortURL(ctx, 8080)
	if err != nil {
		t.Fatal(err)
	}
	if again.Token != u.Token {
		t.Errorf("token %q after a restart, was %q", again.Token, u.Token)
	}
	if body := waitPreview(t, again); body != "awake\n" {
		t.Errorf("after a restart: %q", body)
	}
}
