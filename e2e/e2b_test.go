package e2e

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/forkbox/forkbox/api/e2b/filesystem"
	"github.com/forkbox/forkbox/api/e2b/filesystem/filesystemconnect"
)

// e2bEndpoint restarts the daemon with its E2B endpoint on a free port and
// returns its URL and API key.
func e2bEndpoint(t *testing.T) (string, string) {
	t.Helper()
	addr := freeAddr(t)
	key := "e2b_test_" + runID
	withDaemonFlags(t, "--api-token", key, "--e2b", addr)
	return "http://" + addr, key
}

type e2bCall struct {
	method, path string
	hdr          map[string]string
	body         io.Reader
	ctype        string
}

func doE2B(t *testing.T, base string, c e2bCall) (int, string) {
	t.Helper()
	req, err := http.NewRequest(c.method, base+c.path, c.body)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range c.hdr {
		req.Header.Set(k, v)
	}
	if c.ctype != "" {
		req.Header.Set("Content-Type", c.ctype)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", c.method, c.path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, string(b)
}

// TestE2BEndpointAbuse attacks the E2B-compatible endpoint: missing and
// wrong API keys, missing, wrong and other sandboxes' access tokens,
// malformed ids, oversized headers and bodies, path traversal through
// /files and the filesystem service, an unknown page token, what is not
// served. Each answer must be E2B's error shape with the status E2B's SDK
// maps to the right error class, and nothing may change in the sandbox.
func TestE2BEndpointAbuse(t *testing.T) {
	if out, err := exec.Command(env.bin, "serve", "--e2b", "127.0.0.1:0", "--state-dir", t.TempDir()).CombinedOutput(); err == nil ||
		!strings.Contains(string(out), "--e2b needs --api-token") {
		t.Errorf("serve --e2b without --api-token: got %v, %q; want a refusal", err, out)
	}
	base, key := e2bEndpoint(t)
	api := map[string]string{"X-API-Key": key}
	create := func() (id, token string) {
		code, body := doE2B(t, base, e2bCall{method: "POST", path: "/v2/sandboxes", hdr: api, ctype: "application/json",
			body: strings.NewReader(fmt.Sprintf(`{"templateID":%q,"timeout":300}`, env.image))})
		if code != http.StatusCreated {
			t.Fatalf("create: got %d %s, want 201", code, body)
		}
		var sb struct{ SandboxID, EnvdAccessToken string }
		if err := json.Unmarshal([]byte(body), &sb); err != nil || sb.SandboxID == "" || sb.EnvdAccessToken == "" {
			t.Fatalf("create: %s: %v", body, err)
		}
		t.Cleanup(func() { doE2B(t, base, e2bCall{method: "DELETE", path: "/sandboxes/" + sb.SandboxID, hdr: api}) })
		return sb.SandboxID, sb.EnvdAccessToken
	}
	a, aTok := create()
	b, bTok := create()
	envd := func(id, tok string) map[string]string {
		return map[string]string{"E2b-Sandbox-Id": id, "X-Access-Token": tok}
	}
	// A token for an id that names no sandbox: valid, but nothing to reach.
	mac := hmac.New(sha256.New, []byte(key))
	mac.Write([]byte("forkbox-e2b-envd\x00sb-000000000000"))
	ghostTok := hex.EncodeToString(mac.Sum(nil))
	zeros := func(n int64) io.Reader { return io.LimitReader(zeroReader{}, n) }

	for _, c := range []struct {
		name string
		call e2bCall
		want int
		in   string // in the body
	}{
		{"REST without a key", e2bCall{method: "GET", path: "/v2/sandboxes"}, 401, "API key"},
		{"REST with a wrong key", e2bCall{method: "GET", path: "/v2/sandboxes", hdr: map[string]string{"X-API-Key": key + "x"}}, 401, "API key"},
		{"REST with the key as a bearer token", e2bCall{method: "GET", path: "/v2/sandboxes", hdr: map[string]string{"Authorization": "Bearer " + key}}, 401, ""},
		{"envd token as the API key", e2bCall{method: "GET", path: "/sandboxes/" + a, hdr: map[string]string{"X-API-Key": aTok}}, 401, ""},
		{"a header past its bound", e2bCall{method: "GET", path: "/v2/sandboxes", hdr: map[string]string{"X-API-Key": strings.Repeat("k", 600)}}, 400, "longer than"},
		{"an id that is a path", e2bCall{method: "GET", path: "/sandboxes/..%2f..%2fetc", hdr: api}, 400, "not a valid id"},
		{"an id past its bound", e2bCall{method: "GET", path: "/sandboxes/" + strings.Repeat("a", 200), hdr: api}, 400, "not a valid id"},
		{"an unknown sandbox", e2bCall{method: "GET", path: "/sandboxes/sb-000000000000", hdr: api}, 404, "not found"},
		{"a JSON body past its bound", e2bCall{method: "POST", path: "/sandboxes/" + a + "/timeout", hdr: api, ctype: "application/json",
			body: io.MultiReader(strings.NewReader(`{"timeout":1,"x":"`), zeros(2<<20), strings.NewReader(`"}`))}, 400, "at most"},
		{"bad JSON", e2bCall{method: "POST", path: "/v2/sandboxes", hdr: api, ctype: "application/json", body: strings.NewReader(`{"templateID":`)}, 400, ""},
		{"a page token it never gave", e2bCall{method: "GET", path: "/v2/sandboxes?nextToken=Zm9vOmJhcg", hdr: api}, 400, "nextToken"},
		{"a page past its bound", e2bCall{method: "GET", path: "/v2/sandboxes?limit=100000", hdr: api}, 400, "limit"},
		{"a fork count past its bound", e2bCall{method: "POST", path: "/sandboxes/" + a + "/fork", hdr: api, ctype: "application/json", body: strings.NewReader(`{"count":101}`)}, 400, "count"},
		{"what is not served", e2bCall{method: "POST", path: "/v3/templates", hdr: api}, 501, "forkbox"},
		{"network updates", e2bCall{method: "PUT", path: "/sandboxes/" + a + "/network", hdr: api}, 501, "forkbox"},
		{"MCP at create", e2bCall{method: "POST", path: "/v2/sandboxes", hdr: api, ctype: "application/json",
			body: strings.NewReader(fmt.Sprintf(`{"templateID":%q,"mcp":{"x":{}}}`, env.image))}, 501, "forkbox"},

		{"envd without a token", e2bCall{method: "GET", path: "/files?path=/etc/passwd", hdr: envd(a, "")}, 401, "access token"},
		{"envd with a wrong token", e2bCall{method: "GET", path: "/files?path=/etc/passwd", hdr: envd(a, flip(aTok))}, 401, "access token"},
		{"envd with another sandbox's token", e2bCall{method: "GET", path: "/files?path=/etc/passwd", hdr: envd(a, bTok)}, 401, "access token"},
		{"envd with the API key as token", e2bCall{method: "GET", path: "/files?path=/etc/passwd", hdr: envd(a, key)}, 401, "access token"},
		{"envd for a sandbox that is not there", e2bCall{method: "GET", path: "/health", hdr: envd("sb-000000000000", ghostTok)}, 502, "not found"},
		{"envd with a malformed sandbox id", e2bCall{method: "GET", path: "/health", hdr: envd("../sb", aTok)}, 400, "not a valid id"},
		{"/files traversal", e2bCall{method: "GET", path: "/files?path=/tmp/../etc/passwd", hdr: envd(a, aTok)}, 400, ".."},
		{"/files relative traversal", e2bCall{method: "GET", path: "/files?path=../../etc/passwd", hdr: envd(a, aTok)}, 400, ".."},
		{"/files NUL", e2bCall{method: "GET", path: "/files?path=/etc/passwd%00x", hdr: envd(a, aTok)}, 400, "NUL"},
		{"/files another user", e2bCall{method: "GET", path: "/files?path=/etc/passwd&username=nobody", hdr: envd(a, aTok)}, 400, "root"},
		{"/files signed URL", e2bCall{method: "GET", path: "/files?path=/etc/passwd&signature=v1_x", hdr: envd(a, aTok)}, 501, "forkbox"},
		{"/files upload traversal", e2bCall{method: "POST", path: "/files?path=/tmp/../../planted", hdr: envd(a, aTok),
			ctype: "application/octet-stream", body: strings.NewReader("x")}, 400, ".."},
		{"/files upload past its bound", e2bCall{method: "POST", path: "/files?path=/tmp/huge", hdr: envd(a, aTok),
			ctype: "application/octet-stream", body: zeros(70 << 20)}, 400, "bytes"},
		{"/files upload with metadata", e2bCall{method: "POST", path: "/files?path=/tmp/m", hdr: map[string]string{"E2b-Sandbox-Id": a,
			"X-Access-Token": aTok, "X-Metadata-Owner": "x"}, ctype: "application/octet-stream", body: strings.NewReader("x")}, 501, "forkbox"},
		{"an envd route not served", e2bCall{method: "POST", path: "/init", hdr: envd(a, aTok)}, 501, "forkbox"},
	} {
		code, body := doE2B(t, base, c.call)
		if code != c.want || !strings.Contains(body, c.in) {
			t.Errorf("%s: got %d %.300s, want %d with %q", c.name, code, body, c.want, c.in)
			continue
		}
		var e struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		}
		if json.Unmarshal([]byte(body), &e) != nil || e.Code != code || e.Message == "" {
			t.Errorf("%s: body %.200q is not E2B's error shape {code, message}", c.name, body)
		}
	}

	// The filesystem service refuses traversal with InvalidArgument, and
	// another sandbox's token with Unauthenticated.
	fs := func(id, tok string) filesystemconnect.FilesystemClient {
		return filesystemconnect.NewFilesystemClient(http.DefaultClient, base, connect.WithInterceptors(headers{"E2b-Sandbox-Id": id, "X-Access-Token": tok}))
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, p := range []string{"/tmp/../etc", "../..", "/a\x00b"} {
		if _, err := fs(a, aTok).ListDir(ctx, connect.NewRequest(&filesystem.ListDirRequest{Path: p})); connect.CodeOf(err) != connect.CodeInvalidArgument {
			t.Errorf("ListDir %q: got %v, want InvalidArgument", p, err)
		}
	}
	if _, err := fs(a, aTok).Remove(ctx, connect.NewRequest(&filesystem.RemoveRequest{Path: "/"})); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("Remove /: got %v, want InvalidArgument", err)
	}
	if _, err := fs(b, aTok).Stat(ctx, connect.NewRequest(&filesystem.StatRequest{Path: "/etc"})); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Errorf("Stat with another sandbox's token: got %v, want Unauthenticated", err)
	}
	// Nothing was planted or written by the refused calls.
	for _, p := range []string{"/planted", "/tmp/huge", "/tmp/m"} {
		if _, err := fs(a, aTok).Stat(ctx, connect.NewRequest(&filesystem.StatRequest{Path: p})); connect.CodeOf(err) != connect.CodeNotFound {
			t.Errorf("after the refused uploads, stat %s: got %v, want NotFound", p, err)
		}
	}
	// A killed sandbox's token opens nothing.
	if code, body := doE2B(t, base, e2bCall{method: "DELETE", path: "/sandboxes/" + b, hdr: api}); code != 204 {
		t.Fatalf("kill: got %d %s", code, body)
	}
	if code, _ := doE2B(t, base, e2bCall{method: "GET", path: "/health", hdr: envd(b, bTok)}); code != 502 {
		t.Errorf("health of a killed sandbox: got %d, want 502", code)
	}
}

// flip changes tok's last hex digit.
func flip(tok string) string {
	last := "0"
	if strings.HasSuffix(tok, "0") {
		last = "1"
	}
	return tok[:len(tok)-1] + last
}

type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// headers is a Connect interceptor that adds headers to every call.
type headers map[string]string

func (h headers) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		for k, v := range h {
			req.Header().Set(k, v)
		}
		return next(ctx, req)
	}
}

func (h headers) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (h headers) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}
