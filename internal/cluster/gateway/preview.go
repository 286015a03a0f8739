package gateway

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"fmt"
	"net"
	"path/filepath"
	"sync"

	"connectrpc.com/connect"
	"k8s.io/apimachinery/pkg/types"

	v1 "github.com/forkbox/forkbox/api/forkbox/v1"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/errdefs/errconnect"
	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
	"github.com/forkbox/forkbox/internal/credentials"
	"github.com/forkbox/forkbox/internal/ports"
)

// Preview URLs through the gateway (Options.PortsAddr): the gateway
// serves a preview listener of its own (package ports, the daemon's, so
// the URLs and their forms are the same and the SDKs work unchanged), and
// GetPortURL answers with its URLs, carrying the gateway's port token of
// the sandbox: an HMAC of the sandbox's ID under a key derived from the
// gateway's key file and its namespace, so a URL opens that sandbox only,
// and only through this gateway's tenant. A request to it is relayed to
// the preview listener of the sandbox's node (its ForkboxNode's
// spec.previewEndpoint) in the header form, with the node's port token of
// that sandbox, which the gateway gets from the node's own GetPortURL
// (asked with the nodes' API token) and keeps; the caller's credentials
// go no further than the gateway, and neither the nodes' API token nor
// their port tokens ever reach a caller. The node then checks the port
// (never the agent's), wakes nothing the object does not say runs, and
// proxies HTTP, WebSockets and CONNECT tunnels as on one host.

// maxRelayTokens bounds the nodes' port tokens kept (the map is emptied
// when full: a token is asked for again on its next use).
const maxRelayTokens = 4096

// preview is the gateway's preview listener's backend.
type preview struct {
	g      *Gateway
	keys   *ports.Keys
	domain string
	srv    *ports.Server

	mu     sync.Mutex
	tokens map[relayKey]string
}

// relayKey names a sandbox on a node's preview listener.
type relayKey struct{ node, endpoint, id string }

// openPreviewKeys reads the gateway's key file (creating it, 32 random
// bytes, 0600, on first use) and derives the keys of namespace's port
// tokens from it.
func openPreviewKeys(path, namespace string) (*ports.Keys, error) {
	if path == "" {
		return nil, fmt.Errorf("gateway: a preview listener needs a key file for its port tokens (--ports-key FILE): %w", errdefs.ErrInvalidArgument)
	}
	secret, err := credentials.LoadKey(filepath.Dir(path), filepath.Base(path))
	if err != nil {
		return nil, fmt.Errorf("gateway port token key %s: %v: %w", path, err, errdefs.ErrFailedPrecondition)
	}
	if len(secret) != credentials.KeySize {
		return nil, fmt.Errorf("gateway port token key %s is %d bytes, want %d (delete it to make a new one; every preview link changes): %w",
			path, len(secret), credentials.KeySize, errdefs.ErrFailedPrecondition)
	}
	m := hmac.New(sha256.New, secret)
	m.Write([]byte("forkbox gateway port key v1\x00"))
	m.Write([]byte(namespace))
	return ports.NewKeys(m.Sum(nil)), nil
}

// startPreview serves the gateway's preview listener on o.PortsAddr.
func (g *Gateway) startPreview(keys *ports.Keys) error {
	p := &preview{g: g, keys: keys, domain: g.o.PortsDomain, tokens: map[relayKey]string{}}
	h := ports.NewHandler(p, ports.Options{Keys: keys, APIToken: g.o.Token, Log: g.log, Domain: p.domain})
	srv, err := ports.Listen(g.o.PortsAddr, h, g.log)
	if err != nil {
		return err
	}
	p.srv, g.preview = srv, p
	return nil
}

// Target is where a request for port of sandbox id goes: the preview
// listener of its node, with the node's token of it. A hibernated sandbox
// is woken through its object; a paused one is refused.
func (p *preview) Target(ctx context.Context, id string, port int) (ports.Target, func(), error) {
	if err := ports.CheckPort(port); err != nil {
		return ports.Target{}, nil, err
	}
	sb, err := p.g.sandbox(ctx, id)
	if err != nil {
		return ports.Target{}, nil, err
	}
	if sb.Status.LocalID != id || sb.Closed() { // a name (the token is the ID's), or a sandbox gone as the daemon sees it
		return ports.Target{}, nil, fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	if sb.Spec.State == fbv1.StatePaused {
		return ports.Target{}, nil, fmt.Errorf("sandbox %s is paused: unpause it to reach its ports: %w", id, errdefs.ErrFailedPrecondition)
	}
	r, err := p.g.routeLive(ctx, id) // by the ID the token is of, never a name another sandbox may hold by now
	if err != nil {
		return ports.Target{}, nil, err
	}
	if r.id != id {
		return ports.Target{}, nil, fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	ep, tok, err := p.relay(ctx, r, port)
	if err != nil {
		return ports.Target{}, nil, err
	}
	return ports.Target{Addr: ep, RelayToken: tok}, func() {}, nil
}

// relay is the preview endpoint of r's node and the node's port token of
// r's sandbox (asked for port, once per sandbox: the token is the
// sandbox's, not the port's).
func (p *preview) relay(ctx context.Context, r *route, port int) (endpoint, token string, err error) {
	node := r.obj.Spec.NodeName
	if endpoint, err = p.g.previewEndpoint(ctx, node); err != nil {
		return "", "", err
	}
	k := relayKey{node, endpoint, r.id}
	p.mu.Lock()
	token, ok := p.tokens[k]
	p.mu.Unlock()
	if ok {
		return endpoint, token, nil
	}
	resp, err := r.c.GetPortURL(ctx, connect.NewRequest(&v1.GetPortURLRequest{Sandbox: r.id, Port: int32(port)}))
	if err != nil {
		return "", "", errconnect.FromConnect(err)
	}
	if token = resp.Msg.Token; token == "" {
		return "", "", fmt.Errorf("node %s gave no port token for sandbox %s: %w", node, r.id, errdefs.ErrUnavailable)
	}
	p.mu.Lock()
	if len(p.tokens) >= maxRelayTokens {
		clear(p.tokens)
	}
	p.tokens[k] = token
	p.mu.Unlock()
	return endpoint, token, nil
}

// urls are the gateway's URLs of port of the sandbox ref names, once its
// node has said it can serve them.
func (p *preview) urls(ctx context.Context, ref string, port int) (ports.URLs, error) {
	if err := ports.CheckPort(port); err != nil {
		return ports.URLs{}, err
	}
	// A closed sandbox has no ports: NotFound, as the daemon answers.
	if sb, err := p.g.sandbox(ctx, ref); err != nil {
		return ports.URLs{}, err
	} else if sb.Closed() {
		return ports.URLs{}, fmt.Errorf("sandbox %s is closed: %w", sb.Status.LocalID, errdefs.ErrNotFound)
	}
	r, err := p.g.route(ctx, ref)
	if err != nil {
		return ports.URLs{}, err
	}
	if _, _, err := p.relay(ctx, r, port); err != nil {
		return ports.URLs{}, err
	}
	return ports.BuildURLs(p.srv.Addr(), p.domain, r.id, port, p.keys.Token(r.id)), nil
}

func (p *preview) close() error { return p.srv.Close() }

// previewEndpoint is the preview listener address a node registered.
func (g *Gateway) previewEndpoint(ctx context.Context, node string) (string, error) {
	var n fbv1.ForkboxNode
	if err := g.c.Get(ctx, types.NamespacedName{Name: node}, &n); err != nil {
		return "", kerr(err, "node "+node)
	}
	ep := n.Spec.PreviewEndpoint
	if host, port, err := net.SplitHostPort(ep); err != nil || host == "" || port == "" || port == "0" {
		return "", fmt.Errorf("node %s registered no usable preview endpoint (%q; start it with --ports ADDR, and --node-preview-endpoint when the gateway reaches it elsewhere): %w",
			node, ep, errdefs.ErrFailedPrecondition)
	}
	return ep, nil
}

func (s *sandboxes) GetPortURL(ctx context.Context, req *connect.Request[v1.GetPortURLRequest]) (*connect.Response[v1.GetPortURLResponse], error) {
	if s.g.preview == nil {
		if err := ports.CheckPort(int(req.Msg.Port)); err != nil {
			return nil, err
		}
		return nil, fmt.Errorf("the gateway serves no preview URLs (start it with `forkbox serve --gateway --ports ADDR --ports-key FILE`): %w", errdefs.ErrFailedPrecondition)
	}
	u, err := s.g.preview.urls(ctx, req.Msg.Sandbox, int(req.Msg.Port))
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&v1.GetPortURLResponse{Url: u.URL, Token: u.Token, Host: u.Host, HostUrl: u.HostURL, PathUrl: u.PathURL}), nil
}
