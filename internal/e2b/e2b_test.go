package e2b

import (
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/forkbox/forkbox/api/e2b/process"
	"github.com/forkbox/forkbox/errdefs"
)

func newTestServer(t *testing.T) *Server {
	t.Helper()
	s, err := New(nil, Config{APIKey: "k3y"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// What is refused before the daemon is asked: keys, tokens, ids, headers,
// routes not served.
func TestRefusedBeforeTheDaemon(t *testing.T) {
	if _, err := New(nil, Config{}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("New without a key: got %v, want InvalidArgument", err)
	}
	s := newTestServer(t)
	tok := s.accessToken("sb-1")
	for _, c := range []struct {
		name, method, path string
		hdr                map[string]string
		want               int
	}{
		{"no key", "GET", "/v2/sandboxes", nil, 401},
		{"wrong key", "GET", "/v2/sandboxes", map[string]string{"X-API-Key": "k3z"}, 401},
		{"key prefix", "GET", "/v2/sandboxes", map[string]string{"X-API-Key": "k3"}, 401},
		{"long header", "GET", "/v2/sandboxes", map[string]string{"X-API-Key": strings.Repeat("k", maxHeaderValue+1)}, 400},
		{"not served", "GET", "/volumes", map[string]string{"X-API-Key": "k3y"}, 501},
		{"bad id", "GET", "/sandboxes/a%20b", map[string]string{"X-API-Key": "k3y"}, 400},
		{"envd no token", "GET", "/health", map[string]string{"E2b-Sandbox-Id": "sb-1"}, 401},
		{"envd other sandbox's token", "GET", "/health", map[string]string{"E2b-Sandbox-Id": "sb-2", "X-Access-Token": tok}, 401},
		{"envd the key as token", "GET", "/health", map[string]string{"E2b-Sandbox-Id": "sb-1", "X-Access-Token": "k3y"}, 401},
		{"envd bad id", "GET", "/health", map[string]string{"E2b-Sandbox-Id": "sb/../1", "X-Access-Token": tok}, 400},
	} {
		r := httptest.NewRequest(c.method, c.path, nil)
		for k, v := range c.hdr {
			r.Header.Set(k, v)
		}
		w := httptest.NewRecorder()
		s.ServeHTTP(w, r)
		var e apiError
		if w.Code != c.want || json.Unmarshal(w.Body.Bytes(), &e) != nil || e.Code != c.want || e.Message == "" {
			t.Errorf("%s: got %d %q, want %d in E2B's error shape", c.name, w.Code, w.Body.String(), c.want)
		}
		if c.want == 401 && w.Header().Get("Connection") != "close" {
			t.Errorf("%s: a refusal that keeps its connection alive", c.name)
		}
		if c.want == 501 && !strings.Contains(e.Message, "forkbox") {
			t.Errorf("%s: message %q does not name forkbox", c.name, e.Message)
		}
	}
	if s.accessToken("sb-1") == s.accessToken("sb-2") || len(tok) != 64 {
		t.Errorf("access tokens: got %q for two sandboxes", tok)
	}
}

func TestEgress(t *testing.T) {
	yes, no := true, false
	for _, c := range []struct {
		name        string
		internet    *bool
		n           *networkJSON
		mode        string
		allow, deny string
		class       error
	}{
		{name: "nothing: forkbox's default"},
		{name: "internet", internet: &yes, mode: "all"},
		{name: "no internet", internet: &no, mode: "none"},
		{name: "allowlist", n: &networkJSON{AllowOut: []string{"1.2.3.4"}, DenyOut: []string{"0.0.0.0/0"}}, mode: "allow", allow: "1.2.3.4"},
		{name: "allowlist without internet", internet: &no, n: &networkJSON{AllowOut: []string{"example.com"}}, mode: "allow", allow: "example.com"},
		{name: "denylist", n: &networkJSON{DenyOut: []string{"10.0.0.0/8"}}, mode: "all", deny: "10.0.0.0/8"},
		{name: "deny everything", n: &networkJSON{DenyOut: []string{"0.0.0.0/0"}}, mode: "none"},
		{name: "exceptions to a denylist", n: &networkJSON{AllowOut: []string{"1.2.3.4"}, DenyOut: []string{"10.0.0.0/8"}}, class: errdefs.ErrNotImplemented},
		{name: "proxy", n: &networkJSON{EgressProxy: json.RawMessage(`{"address":"p:1"}`)}, class: errdefs.ErrNotImplemented},
		{name: "private URLs", n: &networkJSON{AllowPublicTraffic: &no}, class: errdefs.ErrNotImplemented},
	} {
		mode, allow, deny, err := egress(c.internet, c.n)
		if c.class != nil {
			if !isClass(err, c.class) {
				t.Errorf("%s: got %v, want %v", c.name, err, c.class)
			}
			continue
		}
		if err != nil || mode != c.mode || strings.Join(allow, ",") != c.allow || strings.Join(deny, ",") != c.deny {
			t.Errorf("%s: got %q %v %v %v, want %q %q %q", c.name, mode, allow, deny, err, c.mode, c.allow, c.deny)
		}
	}
}

func TestListQuery(t *testing.T) {
	q, err := parseListQuery(url.Values{"metadata": {"user=abc&app=prod"}, "state": {"paused"}, "order": {"asc"}, "limit": {"5"},
		"nextToken": {cursor(42, "sb-9")}})
	if err != nil {
		t.Fatal(err)
	}
	if q.metadata["user"] != "abc" || q.metadata["app"] != "prod" || q.states["running"] || !q.states["paused"] || q.desc || q.limit != 5 ||
		q.afterMS != 42 || q.afterID != "sb-9" {
		t.Fatalf("got %+v", q)
	}
	for _, bad := range []url.Values{
		{"state": {"closed"}}, {"order": {"up"}}, {"limit": {"0"}}, {"limit": {"101"}}, {"startedAfter": {"yesterday"}},
		{"nextToken": {"!!"}}, {"nextToken": {base64.RawURLEncoding.EncodeToString([]byte("x:sb-1"))}},
		{"nextToken": {base64.RawURLEncoding.EncodeToString([]byte("1:../x"))}}, {"metadata": {strings.Repeat("a", 5000)}},
	} {
		if _, err := parseListQuery(bad); !errdefs.IsInvalidArgument(err) {
			t.Errorf("query %v: got %v, want InvalidArgument", bad, err)
		}
	}
}

func TestCheckUserAndPaths(t *testing.T) {
	for user, ok := range map[string]bool{"": true, "root": true, "user": false, "nobody": false} {
		h := http.Header{}
		h.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(user+":")))
		if err := checkUser(h); (err == nil) != ok {
			t.Errorf("user %q: got %v, want ok=%v", user, err, ok)
		}
	}
	if err := checkUser(http.Header{"Authorization": {"Bearer x"}}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("a bearer header: got %v, want InvalidArgument", err)
	}
	for p, ok := range map[string]bool{"/a/b": true, "rel/x": true, "": false, "/a/../b": false, "../x": false, "/a\x00": false, strings.Repeat("a", 5000): false} {
		if _, err := filePath(p); (err == nil) != ok {
			t.Errorf("path %.20q: got %v, want ok=%v", p, err, ok)
		}
	}
}

// Output fans out to every attached stream; the end closes them, and a
// stream attached after the end is refused.
func TestProcFanOut(t *testing.T) {
	p := &proc{pid: 7, subs: map[*sub]struct{}{}}
	a, b := newSub(), newSub()
	p.attach(a)
	p.attach(b)
	output{p: p}.Write([]byte("out"))
	output{p: p, stderr: true}.Write([]byte("err"))
	b.leave(p)
	output{p: p}.Write([]byte("more")) // b left: not sent to it, and no wait for it
	p.publish(&process.ProcessEvent{Event: &process.ProcessEvent_End{End: &process.ProcessEvent_EndEvent{Exited: true}}}, true)
	var got []string
	for ev := range a.ch {
		switch e := ev.Event.(type) {
		case *process.ProcessEvent_Data:
			got = append(got, string(e.Data.GetStdout())+string(e.Data.GetStderr()))
		case *process.ProcessEvent_End:
			got = append(got, "end")
		}
	}
	if strings.Join(got, " ") != "out err more end" {
		t.Errorf("stream a: got %q, want %q", got, "out err more end")
	}
	if len(b.ch) != 2 {
		t.Errorf("stream b: got %d events, want the 2 before it left", len(b.ch))
	}
	if p.attach(newSub()) {
		t.Error("attach after the end: got true")
	}
}

func TestStatusOf(t *testing.T) {
	for class, want := range map[error]int{
		errdefs.ErrNotFound: 404, errdefs.ErrInvalidArgument: 400, errdefs.ErrUnauthenticated: 401, errdefs.ErrResourceExhausted: 429,
		errdefs.ErrFailedPrecondition: 409, errdefs.ErrNotImplemented: 501, errdefs.ErrUnavailable: 503, errdefs.ErrInternal: 500,
	} {
		if got := statusOf(class); got != want {
			t.Errorf("%v: got %d, want %d", class, got, want)
		}
	}
}

// The process table bounds what runs by the processes it holds, not by
// their pids: a hostile agent that reports one pid for every process does
// not start more than maxProcs at once in its sandbox, and each one's end
// gives its slot back.
func TestProcTableBoundsReusedPids(t *testing.T) {
	tb := newProcTable()
	var ps []*proc
	for range maxProcs {
		release, err := tb.reserve("sb-1")
		if err != nil {
			t.Fatalf("start %d: %v", len(ps)+1, err)
		}
		p := &proc{sandbox: "sb-1", pid: 7, subs: map[*sub]struct{}{}}
		tb.add(p)
		release()
		ps = append(ps, p)
	}
	if _, err := tb.reserve("sb-1"); !errdefs.IsResourceExhausted(err) {
		t.Fatalf("start %d with every slot held under one pid: %v, want ResourceExhausted", maxProcs+1, err)
	}
	if _, err := tb.reserve("sb-2"); err != nil {
		t.Errorf("another sandbox: %v", err)
	}
	tb.remove(ps[0]) // an earlier one, no longer found by its pid
	tb.remove(ps[0])
	release, err := tb.reserve("sb-1")
	if err != nil {
		t.Fatalf("after one ended: %v", err)
	}
	release()
	if _, err := tb.reserve("sb-1"); err != nil {
		t.Errorf("a released reservation's slot: %v", err)
	}
	for _, p := range ps {
		tb.remove(p)
	}
	if n := tb.running["sb-1"]; n != 0 || len(tb.procs) != 0 {
		t.Errorf("after every process ended: running %d, table %v", n, tb.procs)
	}
}
