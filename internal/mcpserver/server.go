// Package mcpserver is forkbox's Model Context Protocol server: the tools an
// agent uses to create, exec in, fork, checkpoint, restore and close
// sandboxes, and the ledger of each sandbox as a resource. It is a client of
// the daemon through the Go SDK (client/), so it holds no state of its own;
// `forkbox mcp` serves it over stdio or streamable HTTP.
//
// Every byte it hands back is bounded: exec output keeps its last
// max_output_bytes per stream, read_file at most max_bytes, with a flag when
// something was cut. Errors are tool errors (isError) whose text ends with
// the error class in parentheses, like the CLI's, and whose _meta carries
// the class as "errorClass".
package mcpserver

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/errdefs"
)

// Version is reported to MCP clients as the server's version.
const Version = "0.1.0"

// LedgerTemplate is the URI template of a sandbox's ledger resource.
const LedgerTemplate = "forkbox://sandboxes/{id}/ledger"

// SandboxesURI is the resource listing the live sandboxes.
const SandboxesURI = "forkbox://sandboxes"

// New returns an MCP server whose tools and resources act through c.
func New(c *client.Client) *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: "forkbox", Title: "forkbox sandboxes", Version: Version}, &mcp.ServerOptions{
		Instructions: "forkbox runs isolated Linux sandboxes. Create one from an image, run commands with exec, " +
			"fork it to get independent copy-on-write children of its current state, checkpoint and restore it, " +
			"and close it when done. A sandbox is named by its ID (sb-...) or its name.",
	})
	t := &tools{c: c}
	t.register(s)
	s.AddResource(&mcp.Resource{
		URI: SandboxesURI, Name: "sandboxes", MIMEType: "application/json",
		Description: "The live sandboxes.",
	}, t.readSandboxes)
	s.AddResourceTemplate(&mcp.ResourceTemplate{
		URITemplate: LedgerTemplate, Name: "ledger", MIMEType: "application/json",
		Description: "A sandbox's ledger: every event of its session (created, exec started/finished, checkpoints, forks, ...), oldest first. Closed sandboxes too.",
	}, t.readLedger)
	s.AddReceivingMiddleware(errorClassMiddleware)
	return s
}

// errorClassMiddleware puts the error class of a failed tool call in its
// _meta ("errorClass"), for clients that act on the class. Errors that
// carry no class are the SDK's own checks of the arguments.
func errorClassMiddleware(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		res, err := next(ctx, method, req)
		if r, ok := res.(*mcp.CallToolResult); ok && r.IsError {
			class := "InvalidArgument"
			if terr := r.GetError(); terr != nil && errdefs.Class(terr) != errdefs.ErrUnknown {
				class = errdefs.ClassName(terr)
			}
			if r.Meta == nil {
				r.Meta = mcp.Meta{}
			}
			r.Meta["errorClass"] = class
		}
		return res, err
	}
}

// toolError is an error as a tool returns it: its text ends with its class.
type toolError struct{ err error }

func (e toolError) Error() string { return fmt.Sprintf("%s (%s)", e.err, errdefs.ClassName(e.err)) }
func (e toolError) Unwrap() error { return e.err }

func classed(err error) error {
	if err == nil {
		return nil
	}
	return toolError{err}
}

func (t *tools) readSandboxes(ctx context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
	infos, err := t.c.ListSandboxes(ctx, false)
	if err != nil {
		return nil, classed(err)
	}
	out := make([]Sandbox, 0, len(infos))
	for _, i := range infos {
		out = append(out, sandboxOut(i))
	}
	return jsonResource(req.Params.URI, out)
}

func (t *tools) readLedger(ctx context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
	uri := req.Params.URI
	rest, ok := strings.CutPrefix(uri, "forkbox://sandboxes/")
	id, ok2 := strings.CutSuffix(rest, "/ledger")
	if !ok || !ok2 || id == "" || strings.Contains(id, "/") {
		return nil, mcp.ResourceNotFoundError(uri)
	}
	events, err := t.c.Events(ctx, id)
	if errdefs.IsNotFound(err) {
		return nil, mcp.ResourceNotFoundError(uri)
	}
	if err != nil {
		return nil, classed(err)
	}
	return jsonResource(uri, events)
}

func jsonResource(uri string, v any) (*mcp.ReadResourceResult, error) {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return nil, err
	}
	return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: uri, MIMEType: "application/json", Text: string(b)}}}, nil
}

// HTTPHandler serves s over streamable HTTP: every request must carry
// "Authorization: Bearer <token>". An empty token lets nothing through: the
// server holds the daemon's credentials, and a loopback port is open to every
// user of the host.
func HTTPHandler(s *mcp.Server, token string) http.Handler {
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if token == "" || !ok || subtle.ConstantTimeCompare([]byte(got), []byte(token)) != 1 {
			w.Header().Set("WWW-Authenticate", "Bearer")
			http.Error(w, "missing or wrong bearer token", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// errInvalid builds an InvalidArgument error.
func errInvalid(format string, args ...any) error {
	return fmt.Errorf(format+": %w", append(args, errdefs.ErrInvalidArgument)...)
}
