package cluster

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	fbclient "github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/errdefs"
	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
	"github.com/forkbox/forkbox/internal/cluster/clustertest"
	"github.com/forkbox/forkbox/internal/porttest"
)

// upgradeScript answers one HTTP upgrade with 101 and then echoes (the
// first step of a WebSocket, from busybox); dumpScript answers a request
// with its own request line and headers, as the app saw them.
const (
	upgradeScript = `#!/bin/sh
while IFS= read -r l; do [ ${#l} -le 1 ] && break; done
printf 'HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n'
exec cat
`
	dumpScript = `#!/bin/sh
req=""
while IFS= read -r l; do [ ${#l} -le 1 ] && break; req="$req$l
"; done
printf 'HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s' "${#req}" "$req"
`
)

// TestGatewayPreviewURL: GetPortURL through the gateway answers with the
// gateway's own URLs (the daemon's forms, so the SDKs work unchanged) and
// its own token of the sandbox; a request to them reaches the server in
// the sandbox through its node's preview listener — HTTP by either form,
// an upgrade, a CONNECT tunnel — with none of forkbox's credentials. A's
// token opens nothing of B's; a wrong token, the node's own token of the
// sandbox, or the nodes' API token open nothing at the gateway, and the
// gateway's token opens nothing at the node; the nodes' token is never in
// an answer; a closed sandbox's URL is 404.
func TestGatewayPreviewURL(t *testing.T) {
	c := gateway(t)
	forEachRuntime(t, func(t *testing.T, rt fbv1.Runtime) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		a := previewSandbox(t, c, "preview-a-"+string(rt), rt, "served-by-a")
		b := previewSandbox(t, c, "preview-b-"+string(rt), rt, "served-by-b")
		ua, err := a.PortURL(ctx, 8080)
		if err != nil {
			t.Fatal(err)
		}
		ub, err := b.PortURL(ctx, 8080)
		if err != nil {
			t.Fatal(err)
		}
		// The SDKs' oracle (ports.test.mjs, test_port_url): the host form
		// below localhost with the gateway listener's port, the link
		// carrying the token, the path form on the same listener.
		pu, _ := url.Parse(ua.PathURL)
		_, gwPort, _ := net.SplitHostPort(pu.Host)
		if ua.Host != fmt.Sprintf("8080-%s.localhost:%s", a.ID, gwPort) || ua.URL != "http://"+ua.Host+"/?forkbox_token="+ua.Token || ua.URL != ua.HostURL ||
			ua.PathURL != fmt.Sprintf("http://127.0.0.1:%s/sandboxes/%s/ports/8080/?forkbox_token=%s", gwPort, a.ID, ua.Token) {
			t.Fatalf("URLs %+v", ua)
		}
		nodeA := nodeOf(t, a)
		nodeTok, err := nodeA.Client.Sandbox(ctx, a.ID)
		if err != nil {
			t.Fatal(err)
		}
		nu, err := nodeTok.PortURL(ctx, 8080)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range nodes() {
			if strings.Contains(ua.PathURL, n.PreviewEndpoint) || strings.Contains(ua.PathURL, n.IP) {
				t.Errorf("the gateway's URL %s names node %s's listener", ua.PathURL, n.Name)
			}
		}
		if ua.Token == nu.Token || ua.Token == ub.Token || strings.Contains(fmt.Sprint(*ua, *ub), cl.Token) || strings.Contains(fmt.Sprint(*ua), nu.Token) {
			t.Fatalf("tokens: gateway's of A %q, of B %q, the node's of A %q: want three different ones, and no node credential in %+v", ua.Token, ub.Token, nu.Token, *ua)
		}
		if body := waitPreview(t, ua); body != "served-by-a\n" {
			t.Errorf("host form: %q", body)
		}
		if code, body := previewGet(t, ua, false, "/index.html", tok(ua.Token)); code != 200 || body != "served-by-a\n" {
			t.Errorf("path form: %d %q", code, body)
		}
		if body := waitPreview(t, ub); body != "served-by-b\n" {
			t.Errorf("B by host: %q", body)
		}
		// The gateway's API token is a bearer here as on a daemon; the
		// nodes' is nothing.
		if code, body := previewGet(t, ua, true, "/index.html", http.Header{"Authorization": {"Bearer " + gw.token}}); code != 200 || body != "served-by-a\n" {
			t.Errorf("the gateway's API token: %d %q", code, body)
		}
		if code, _ := previewGet(t, ua, true, "/index.html", http.Header{"Authorization": {"Bearer " + cl.Token}}); code != http.StatusUnauthorized {
			t.Errorf("the nodes' API token at the gateway: %d, want 401", code)
		}

		// Abuse: each of these is refused, and never served B's page.
		aOnB := *ub
		aOnB.Token = ua.Token
		for name, tc := range map[string]struct {
			u      *fbclient.PortURL
			byHost bool
			hdr    http.Header
			want   int
		}{
			"no token":                  {ua, true, nil, http.StatusUnauthorized},
			"a wrong token":             {ua, true, tok(strings.Repeat("x", 43)), http.StatusForbidden},
			"A's token on B's host":     {&aOnB, true, tok(ua.Token), http.StatusForbidden},
			"A's token on B's path":     {&aOnB, false, tok(ua.Token), http.StatusForbidden},
			"A's link on B's host":      {&aOnB, true, nil, http.StatusForbidden}, // the query token, below
			"the node's token of A":     {ua, true, tok(nu.Token), http.StatusForbidden},
			"a route header to B":       {ua, true, http.Header{fbclient.PortTokenHeader: {ua.Token}, "X-Forkbox-Port-Route": {"8080-" + b.ID}}, http.StatusForbidden},
			"A's token, the agent port": {&fbclient.PortURL{PathURL: ua.PathURL, Host: strings.Replace(ua.Host, "8080-", "7077-", 1)}, true, tok(ua.Token), http.StatusForbidden},
		} {
			path := "/index.html"
			if name == "A's link on B's host" {
				path += "?forkbox_token=" + ua.Token
			}
			if code, body := previewGet(t, tc.u, tc.byHost, path, tc.hdr); code != tc.want || strings.Contains(body, "served-by") {
				t.Errorf("%s: %d %q, want %d", name, code, body, tc.want)
			}
		}
		if _, err := a.PortURL(ctx, 7077); !errdefs.IsPermissionDenied(err) {
			t.Errorf("GetPortURL of the agent's port: %v, want PermissionDenied", err)
		}
		// The gateway's token at the node's own listener opens nothing.
		direct := &fbclient.PortURL{PathURL: "http://" + nodeA.PreviewEndpoint + "/sandboxes/" + a.ID + "/ports/8080/", Host: fmt.Sprintf("8080-%s.localhost", a.ID)}
		for _, hdr := range []http.Header{tok(ua.Token), {"Authorization": {"Bearer " + gw.token}}} {
			if code, body := previewGet(t, direct, true, "/index.html", hdr); code/100 != 4 {
				t.Errorf("the gateway's credentials %v at node %s: %d %q, want refused", hdr, nodeA.Name, code, body)
			}
		}

		// What the app sees: the Host its client used, no forkbox
		// credential, no route header.
		ud, err := a.PortURL(ctx, 9002)
		if err != nil {
			t.Fatal(err)
		}
		seen := waitPreviewPath(t, ud, "/seen?x=1&forkbox_token="+ud.Token, http.Header{"Authorization": {"Bearer app-own"}, fbclient.PortTokenHeader: {ud.Token}})
		if !strings.HasPrefix(seen, "GET /seen?x=1 HTTP/1.1") || !strings.Contains(seen, "Host: "+ud.Host) || !strings.Contains(seen, "Authorization: Bearer app-own") {
			t.Errorf("the app saw:\n%s", seen)
		}
		for _, secret := range []string{ud.Token, gw.token, cl.Token, "X-Forkbox-Port", "forkbox_token"} {
			if strings.Contains(strings.ToLower(seen), strings.ToLower(secret)) {
				t.Errorf("the app saw %q:\n%s", secret, seen)
			}
		}

		// Raw TCP through a CONNECT tunnel, and an upgrade round trip.
		u9000, err := a.PortURL(ctx, 9000)
		if err != nil {
			t.Fatal(err)
		}
		tun := waitDial(t, u9000)
		echoThrough(t, tun, "ping through the gateway's tunnel\n")
		tun.Close()
		bad := *u9000
		bad.Token = ub.Token
		if _, err := bad.Dial(ctx); !errdefs.IsPermissionDenied(err) {
			t.Errorf("a tunnel with B's token to A: %v, want PermissionDenied", err)
		}
		u9001, err := a.PortURL(ctx, 9001)
		if err != nil {
			t.Fatal(err)
		}
		upgradeEcho(t, u9001)

		// A closed sandbox's URL leads nowhere.
		if err := b.Close(ctx); err != nil {
			t.Fatal(err)
		}
		if err := waitFor(time.Minute, func() error {
			if code, _ := previewGet(t, ub, true, "/index.html", tok(ub.Token)); code != http.StatusNotFound {
				return fmt.Errorf("closed B: %d, want 404", code)
			}
			return nil
		}); err != nil {
			t.Error(err)
		}
		if _, err := b.PortURL(ctx, 8080); !errdefs.IsNotFound(err) {
			t.Errorf("GetPortURL of a closed sandbox: %v, want NotFound", err)
		}
	})
}

// previewSandbox creates name through the gateway with, on 8080, httpd
// serving body, a TCP echo on 9000, the upgrade echo on 9001 and the
// request dump on 9002.
func previewSandbox(t *testing.T, c *fbclient.Client, name string, rt fbv1.Runtime, body string) *fbclient.Sandbox {
	t.Helper()
	ctx := context.Background()
	sb, err := c.CreateSandbox(ctx, fbclient.CreateOptions{Image: env.image, Name: name, Runtime: string(rt)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sb.Close(context.Background()) })
	for path, script := range map[string]string{"/up.sh": upgradeScript, "/dump.sh": dumpScript} {
		if err := sb.WriteFile(ctx, path, []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := sb.Exec(ctx, fbclient.ExecOptions{Shell: "mkdir -p /www && echo " + body + " > /www/index.html"}); err != nil {
		t.Fatal(err)
	}
	for _, cmd := range []string{"httpd -f -p 8080 -h /www", "nc -ll -p 9000 -e cat", "nc -ll -p 9001 -e /up.sh", "nc -ll -p 9002 -e /dump.sh"} {
		if _, err := sb.Start(ctx, fbclient.ExecOptions{Shell: cmd}); err != nil {
			t.Fatalf("start %s: %v", cmd, err)
		}
	}
	return sb
}

// nodeOf is the node that runs sb.
func nodeOf(t *testing.T, sb *fbclient.Sandbox) *clustertest.Node {
	t.Helper()
	obj := get(t, &fbv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: gw.namespace, Name: sb.Info.Name}})
	n := nodeNamed(obj.Spec.NodeName)
	if n == nil {
		t.Fatalf("sandbox %s is on node %q, not one of the cluster's", sb.Info.Name, obj.Spec.NodeName)
	}
	return n
}

// previewGet sends one GET to the listener of u's path URL, by the host
// form (Host header) or the path form, without following redirects.
func previewGet(t *testing.T, u *fbclient.PortURL, byHost bool, path string, hdr http.Header) (int, string) {
	t.Helper()
	code, body, _ := porttest.Get(t, u, byHost, path, hdr)
	return code, body
}

var (
	tok         = porttest.Tok
	upgradeEcho = porttest.UpgradeEcho
	waitDial    = porttest.WaitDial
	echoThrough = porttest.EchoThrough
)

// waitPreview waits until a GET of index.html by the host form with the
// token answers 200 (502 until the server in the sandbox listens).
func waitPreview(t *testing.T, u *fbclient.PortURL) string {
	t.Helper()
	return waitPreviewPath(t, u, "/index.html", tok(u.Token))
}

func waitPreviewPath(t *testing.T, u *fbclient.PortURL, path string, hdr http.Header) string {
	t.Helper()
	return porttest.WaitPreview(t, u, path, hdr)
}
