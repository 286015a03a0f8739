package mcpserver

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"connectrpc.com/connect"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	v1 "github.com/forkbox/forkbox/api/forkbox/v1"
	"github.com/forkbox/forkbox/api/forkbox/v1/forkboxv1connect"
	"github.com/forkbox/forkbox/client"
)

// fakeDaemon is a SandboxService that keeps sandboxes and files in memory
// and answers exec with canned output.
type fakeDaemon struct {
	forkboxv1connect.UnimplementedSandboxServiceHandler
	mu        sync.Mutex
	sandboxes map[string]*v1.Sandbox
	files     map[string][]byte // sandbox id + path
	// stdout of the next exec: this many bytes of 'a'..'z', then exit 3.
	execStdout int
	lastExec   *v1.ExecRequest
}

func newFake() *fakeDaemon {
	return &fakeDaemon{sandboxes: map[string]*v1.Sandbox{}, files: map[string][]byte{}}
}

func (f *fakeDaemon) lookup(idOrName string) (*v1.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, s := range f.sandboxes {
		if s.Id == idOrName || s.Name == idOrName {
			return s, nil
		}
	}
	return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("sandbox %q: not found", idOrName))
}

func (f *fakeDaemon) add(name, parent string) *v1.Sandbox {
	f.mu.Lock()
	defer f.mu.Unlock()
	id := fmt.Sprintf("sb-%d", len(f.sandboxes)+1)
	if name == "" {
		name = id
	}
	s := &v1.Sandbox{Id: id, Name: name, State: "running", Image: "img", ParentId: parent, CreatedAtUnixMs: 1700000000000}
	f.sandboxes[id] = s
	return s
}

func (f *fakeDaemon) CreateSandbox(_ context.Context, r *connect.Request[v1.CreateSandboxRequest]) (*connect.Response[v1.CreateSandboxResponse], error) {
	if r.Msg.Image != "img" {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("image %q: not found", r.Msg.Image))
	}
	return connect.NewResponse(&v1.CreateSandboxResponse{Sandbox: f.add(r.Msg.Name, "")}), nil
}

func (f *fakeDaemon) GetSandbox(_ context.Context, r *connect.Request[v1.GetSandboxRequest]) (*connect.Response[v1.GetSandboxResponse], error) {
	s, err := f.lookup(r.Msg.Sandbox)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&v1.GetSandboxResponse{Sandbox: s}), nil
}

func (f *fakeDaemon) ListSandboxes(context.Context, *connect.Request[v1.ListSandboxesRequest]) (*connect.Response[v1.ListSandboxesResponse], error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	resp := &v1.ListSandboxesResponse{}
	for _, s := range f.sandboxes {
		resp.Sandboxes = append(resp.Sandboxes, s)
	}
	return connect.NewResponse(resp), nil
}

func (f *fakeDaemon) DeleteSandbox(_ context.Context, r *connect.Request[v1.DeleteSandboxRequest]) (*connect.Response[v1.DeleteSandboxResponse], error) {
	s, err := f.lookup(r.Msg.Sandbox)
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	delete(f.sandboxes, s.Id)
	f.mu.Unlock()
	return connect.NewResponse(&v1.DeleteSandboxResponse{}), nil
}

func (f *fakeDaemon) Exec(_ context.Context, r *connect.Request[v1.ExecRequest], st *connect.ServerStream[v1.ExecResponse]) error {
	if _, err := f.lookup(r.Msg.Sandbox); err != nil {
		return err
	}
	f.mu.Lock()
	f.lastExec = r.Msg
	n := f.execStdout
	f.mu.Unlock()
	for sent := 0; sent < n; {
		chunk := min(n-sent, 4096)
		b := make([]byte, chunk)
		for i := range b {
			b[i] = byte('a' + (sent+i)%26)
		}
		if err := st.Send(&v1.ExecResponse{Event: &v1.ExecResponse_Stdout{Stdout: b}}); err != nil {
			return err
		}
		sent += chunk
	}
	if err := st.Send(&v1.ExecResponse{Event: &v1.ExecResponse_Stderr{Stderr: []byte("warn\n")}}); err != nil {
		return err
	}
	return st.Send(&v1.ExecResponse{Event: &v1.ExecResponse_Exit{Exit: &v1.ExecExit{ExitCode: 3, DurationMs: 1.5}}})
}

func (f *fakeDaemon) WriteFile(_ context.Context, r *connect.Request[v1.WriteFileRequest]) (*connect.Response[v1.WriteFileResponse], error) {
	f.mu.Lock()
	f.files[r.Msg.Sandbox+r.Msg.Path] = r.Msg.Data
	f.mu.Unlock()
	return connect.NewResponse(&v1.WriteFileResponse{}), nil
}

func (f *fakeDaemon) ReadFile(_ context.Context, r *connect.Request[v1.ReadFileRequest]) (*connect.Response[v1.ReadFileResponse], error) {
	f.mu.Lock()
	data, ok := f.files[r.Msg.Sandbox+r.Msg.Path]
	f.mu.Unlock()
	if !ok {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("%s: no such file", r.Msg.Path))
	}
	return connect.NewResponse(&v1.ReadFileResponse{Data: data}), nil
}

func (f *fakeDaemon) Events(_ context.Context, r *connect.Request[v1.EventsRequest]) (*connect.Response[v1.EventsResponse], error) {
	s, err := f.lookup(r.Msg.Sandbox)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&v1.EventsResponse{Events: []*v1.Event{
		{Seq: 1, SandboxId: s.Id, Type: "sandbox.created", TimeUnixMs: 1700000000000, DataJson: `{"image":"img"}`},
	}}), nil
}

func (f *fakeDaemon) Fork(_ context.Context, r *connect.Request[v1.ForkRequest]) (*connect.Response[v1.ForkResponse], error) {
	src, err := f.lookup(r.Msg.Sandbox)
	if err != nil {
		return nil, err
	}
	resp := &v1.ForkResponse{Checkpoint: &v1.Checkpoint{Id: "ck-1", Tag: r.Msg.Tag, SandboxId: src.Id, Kind: "filesystem"}, Captured: "filesystem"}
	for i := range int(r.Msg.Count) {
		if i == 1 { // the second child fails
			resp.Children = append(resp.Children, &v1.ForkChild{Error: "no free slot", ErrorClass: "ResourceExhausted"})
			continue
		}
		resp.Children = append(resp.Children, &v1.ForkChild{Sandbox: f.add("", src.Id), StartMs: 2})
	}
	return connect.NewResponse(resp), nil
}

// start serves a fake daemon and an MCP server on it, connected to an MCP
// client session over in-memory transports.
func start(t *testing.T) (*fakeDaemon, *mcp.ClientSession) {
	t.Helper()
	f := newFake()
	mux := http.NewServeMux()
	mux.Handle(forkboxv1connect.NewSandboxServiceHandler(f))
	hs := httptest.NewServer(mux)
	t.Cleanup(hs.Close)
	return f, connectMCP(t, New(&client.Client{URL: hs.URL}))
}

func connectMCP(t *testing.T, s *mcp.Server) *mcp.ClientSession {
	t.Helper()
	ctx := context.Background()
	st, ct := mcp.NewInMemoryTransports()
	ss, err := s.Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ss.Close() })
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "v0"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

// call calls a tool; out (if not nil) receives its structured content.
func call(t *testing.T, cs *mcp.ClientSession, name string, args map[string]any, out any) *mcp.CallToolResult {
	t.Helper()
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("%s: protocol error: %v", name, err)
	}
	if out != nil && !res.IsError {
		b, _ := json.Marshal(res.StructuredContent)
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s: structured content %s: %v", name, b, err)
		}
	}
	return res
}

func text(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

func TestToolsHaveSchemas(t *testing.T) {
	_, cs := start(t)
	res, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, tool := range res.Tools {
		got[tool.Name] = true
		if tool.InputSchema == nil || tool.OutputSchema == nil || tool.Description == "" {
			t.Errorf("tool %s: want input and output schemas and a description", tool.Name)
		}
	}
	for _, want := range []string{"create", "exec", "write_file", "read_file", "fork", "checkpoint", "list", "restore", "close"} {
		if !got[want] {
			t.Errorf("tool %s missing; got %v", want, got)
		}
	}
	tmpl, err := cs.ListResourceTemplates(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(tmpl.ResourceTemplates) != 1 || tmpl.ResourceTemplates[0].URITemplate != LedgerTemplate {
		t.Errorf("got resource templates %+v, want %s", tmpl.ResourceTemplates, LedgerTemplate)
	}
}

func TestExecKeepsBoundedTail(t *testing.T) {
	f, cs := start(t)
	call(t, cs, "create", map[string]any{"image": "img", "name": "box"}, nil)
	f.mu.Lock()
	f.execStdout = 100_000
	f.mu.Unlock()
	var out ExecOut
	res := call(t, cs, "exec", map[string]any{"sandbox": "box", "command": "yes", "max_output_bytes": 1000}, &out)
	if res.IsError {
		t.Fatalf("a non-zero exit is a result, got a tool error: %s", text(res))
	}
	if out.ExitCode != 3 || len(out.Stdout) != 1000 || !out.StdoutTruncated || out.Stderr != "warn\n" || out.StderrTruncated {
		t.Errorf("got exit %d, %d bytes of stdout (truncated %v), stderr %q (truncated %v); want 3, 1000 (true), \"warn\\n\" (false)",
			out.ExitCode, len(out.Stdout), out.StdoutTruncated, out.Stderr, out.StderrTruncated)
	}
	if want := byte('a' + (100_000-1)%26); out.Stdout[len(out.Stdout)-1] != want {
		t.Errorf("got last byte %q, want %q (the tail is kept)", out.Stdout[len(out.Stdout)-1], want)
	}
	f.mu.Lock()
	last := f.lastExec
	f.mu.Unlock()
	if last.Shell != "yes" || last.TimeoutMs != DefaultExecTimeout.Milliseconds() {
		t.Errorf("got shell %q timeout %d ms, want yes and the default timeout", last.Shell, last.TimeoutMs)
	}
}

func TestErrorsCarryTheirClass(t *testing.T) {
	_, cs := start(t)
	call(t, cs, "create", map[string]any{"image": "img", "name": "box"}, nil)
	for _, tc := range []struct {
		tool  string
		args  map[string]any
		class string
	}{
		{"exec", map[string]any{"sandbox": "nope", "command": "true"}, "NotFound"},
		{"create", map[string]any{"image": "missing"}, "NotFound"},
		{"exec", map[string]any{"sandbox": "box", "command": "true", "argv": []string{"true"}}, "InvalidArgument"},
		{"exec", map[string]any{"sandbox": "box", "command": "true", "max_output_bytes": MaxOutputBytesLimit + 1}, "InvalidArgument"},
		{"exec", map[string]any{"command": "true"}, "InvalidArgument"}, // schema: sandbox is required
		{"read_file", map[string]any{"sandbox": "box", "path": "/nofile"}, "NotFound"},
		{"fork", map[string]any{"sandbox": "box", "count": 101}, "InvalidArgument"},
		{"close", map[string]any{"sandbox": "nope"}, "NotFound"},
	} {
		res := call(t, cs, tc.tool, tc.args, nil)
		if !res.IsError {
			t.Errorf("%s %v: got success, want a %s tool error", tc.tool, tc.args, tc.class)
			continue
		}
		if got := res.Meta["errorClass"]; got != tc.class {
			t.Errorf("%s %v: got errorClass %v, want %s (%s)", tc.tool, tc.args, got, tc.class, text(res))
		}
		if tc.class != "InvalidArgument" && !strings.HasSuffix(text(res), "("+tc.class+")") {
			t.Errorf("%s %v: got text %q, want it to end with (%s)", tc.tool, tc.args, text(res), tc.class)
		}
	}
}

func TestFilesAreBounded(t *testing.T) {
	_, cs := start(t)
	call(t, cs, "create", map[string]any{"image": "img", "name": "box"}, nil)
	call(t, cs, "write_file", map[string]any{"sandbox": "box", "path": "/t", "content": "héllo wörld"}, nil)
	var out ReadFileOut
	call(t, cs, "read_file", map[string]any{"sandbox": "box", "path": "/t", "max_bytes": 2}, &out)
	// "hé" is 3 bytes: cut at 2 bytes, the half character is dropped.
	if out.Content != "h" || out.Encoding != "utf8" || !out.Truncated || out.Size != len("héllo wörld") {
		t.Errorf("got %+v, want content \"h\" (utf8), truncated, size %d", out, len("héllo wörld"))
	}
	call(t, cs, "write_file", map[string]any{"sandbox": "box", "path": "/b", "content": "AP8A/w==", "encoding": "base64"}, nil)
	call(t, cs, "read_file", map[string]any{"sandbox": "box", "path": "/b"}, &out)
	if out.Content != "AP8A/w==" || out.Encoding != "base64" || out.Truncated {
		t.Errorf("got %+v, want the bytes back as base64, not truncated", out)
	}
	big := strings.Repeat("x", WriteBytesLimit+1)
	if res := call(t, cs, "write_file", map[string]any{"sandbox": "box", "path": "/big", "content": big}, nil); !res.IsError {
		t.Errorf("write of %d bytes: got success, want InvalidArgument", len(big))
	}
}

func TestForkReturnsPerChildResults(t *testing.T) {
	_, cs := start(t)
	call(t, cs, "create", map[string]any{"image": "img", "name": "box"}, nil)
	var out ForkOut
	res := call(t, cs, "fork", map[string]any{"sandbox": "box", "count": 3, "tag": "t"}, &out)
	if res.IsError {
		t.Fatal(text(res))
	}
	if len(out.Children) != 3 || out.Checkpoint == nil || out.Checkpoint.ID != "ck-1" || out.Captured != "filesystem" {
		t.Fatalf("got %+v, want 3 children from ck-1", out)
	}
	if c := out.Children[1]; c.Sandbox != nil || c.ErrorClass != "ResourceExhausted" {
		t.Errorf("child 2: got %+v, want a ResourceExhausted error", c)
	}
	for _, i := range []int{0, 2} {
		if c := out.Children[i]; c.Sandbox == nil || c.Sandbox.ParentID != "sb-1" || c.Error != "" {
			t.Errorf("child %d: got %+v, want a sandbox forked from sb-1", i+1, c)
		}
	}
	var list ListOut
	call(t, cs, "list", map[string]any{}, &list)
	if len(list.Sandboxes) != 3 {
		t.Errorf("got %d sandboxes listed, want 3 (the source and 2 children)", len(list.Sandboxes))
	}
	var closed CloseOut
	call(t, cs, "close", map[string]any{"sandbox": out.Children[0].Sandbox.ID}, &closed)
	if closed.Closed != out.Children[0].Sandbox.ID {
		t.Errorf("got closed %q, want %q", closed.Closed, out.Children[0].Sandbox.ID)
	}
}

func TestLedgerResource(t *testing.T) {
	_, cs := start(t)
	call(t, cs, "create", map[string]any{"image": "img", "name": "box"}, nil)
	ctx := context.Background()
	res, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: "forkbox://sandboxes/box/ledger"})
	if err != nil {
		t.Fatal(err)
	}
	var events []client.Event
	if err := json.Unmarshal([]byte(res.Contents[0].Text), &events); err != nil {
		t.Fatal(err)
	}
	if len(events) != 1 || events[0].Type != "sandbox.created" || events[0].Data["image"] != "img" {
		t.Errorf("got %+v, want the sandbox.created event", events)
	}
	res, err = cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: SandboxesURI})
	if err != nil {
		t.Fatal(err)
	}
	var sandboxes []Sandbox
	if err := json.Unmarshal([]byte(res.Contents[0].Text), &sandboxes); err != nil {
		t.Fatal(err)
	}
	if len(sandboxes) != 1 || sandboxes[0].Name != "box" {
		t.Errorf("got %+v, want the one sandbox", sandboxes)
	}
	_, err = cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: "forkbox://sandboxes/nope/ledger"})
	if err == nil || !strings.Contains(err.Error(), "not found") {
		t.Errorf("ledger of an unknown sandbox: got %v, want resource not found", err)
	}
}

func TestDaemonUnreachableIsUnavailable(t *testing.T) {
	cs := connectMCP(t, New(&client.Client{Socket: t.TempDir() + "/none.sock"}))
	res := call(t, cs, "list", map[string]any{}, nil)
	if !res.IsError || res.Meta["errorClass"] != "Unavailable" {
		t.Errorf("got %v %v (%s), want an Unavailable tool error", res.IsError, res.Meta, text(res))
	}
}

// serveHTTP serves the MCP server over streamable HTTP with token, in
// front of a fake daemon, and returns its URL.
func serveHTTP(t *testing.T, token string) string {
	t.Helper()
	mux := http.NewServeMux()
	mux.Handle(forkboxv1connect.NewSandboxServiceHandler(newFake()))
	daemon := httptest.NewServer(mux)
	t.Cleanup(daemon.Close)
	hs := httptest.NewServer(HTTPHandler(New(&client.Client{URL: daemon.URL}), token))
	t.Cleanup(hs.Close)
	return hs.URL
}

func TestHTTPNeedsToken(t *testing.T) {
	url := serveHTTP(t, "s3cret")

	body := []byte(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`)
	resp, err := http.Post(url, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("without a token: got %s, want 401", resp.Status)
	}

	hc := &http.Client{Transport: bearer{"s3cret"}}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "v0"}, nil).
		Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: hc}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	if res := call(t, cs, "create", map[string]any{"image": "img"}, nil); res.IsError {
		t.Errorf("create over HTTP with the token: %s", text(res))
	}
}

// TestHTTPEmptyTokenLetsNothingThrough: a handler made without a token
// fails closed, whatever the request carries.
func TestHTTPEmptyTokenLetsNothingThrough(t *testing.T) {
	url := serveHTTP(t, "")

	body := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"x","version":"0"}}}`
	for _, auth := range []string{"", "Bearer ", "Bearer x", "Basic Og=="} {
		req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("Authorization %q: got %s, want 401", auth, resp.Status)
		}
	}
}

type bearer struct{ token string }

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return http.DefaultTransport.RoundTrip(r)
}

func TestTail(t *testing.T) {
	for _, tc := range []struct {
		max       int
		writes    []string
		want      string
		truncated bool
	}{
		{10, []string{"abc", "def"}, "abcdef", false},
		{4, []string{"abc", "def"}, "cdef", true},
		{4, []string{"abcdefgh"}, "efgh", true},
		{4, []string{"abcd"}, "abcd", false},
		{4, []string{"ab", "cdef"}, "cdef", true},
		{0, []string{"x"}, "", true},
		{3, []string{"a", "é"}, "aé", false},
		{2, []string{"aé"}, "é", true},
		{1, []string{"aé"}, "", true}, // half a character is dropped
	} {
		tl := &tail{max: tc.max}
		for _, w := range tc.writes {
			tl.Write([]byte(w))
		}
		if got := tl.String(); got != tc.want || tl.truncated != tc.truncated {
			t.Errorf("max %d, writes %q: got %q (truncated %v), want %q (%v)", tc.max, tc.writes, got, tl.truncated, tc.want, tc.truncated)
		}
	}
}
