package gateway

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"connectrpc.com/connect"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/forkbox/forkbox/api/forkbox/v1/forkboxv1connect"
	"github.com/forkbox/forkbox/errdefs"
	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
)

// nodeClients are typed Connect clients of the nodes' APIs, one per
// endpoint, speaking h2c (the daemon serves it on TCP; bidi streams need
// HTTP/2), each request carrying the nodes' token and nothing of the
// caller's.
type nodeClients struct {
	token string
	tr    *http.Transport
	mu    sync.Mutex
	byEP  map[string]forkboxv1connect.SandboxServiceClient
	imgs  map[string]forkboxv1connect.ImageServiceClient
}

func newNodeClients(token string) *nodeClients {
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	tr := &http.Transport{Protocols: &p, DialContext: (&net.Dialer{Timeout: 10 * time.Second}).DialContext,
		ResponseHeaderTimeout: 0, IdleConnTimeout: 90 * time.Second}
	return &nodeClients{token: token, tr: tr, byEP: map[string]forkboxv1connect.SandboxServiceClient{},
		imgs: map[string]forkboxv1connect.ImageServiceClient{}}
}

func (n *nodeClients) get(endpoint string) forkboxv1connect.SandboxServiceClient {
	n.mu.Lock()
	defer n.mu.Unlock()
	c, ok := n.byEP[endpoint]
	if !ok {
		c = forkboxv1connect.NewSandboxServiceClient(&http.Client{Transport: n.tr}, "http://"+endpoint,
			connect.WithInterceptors(nodeAuth{n.token}))
		n.byEP[endpoint] = c
	}
	return c
}

// images is the ImageService of the node at endpoint.
func (n *nodeClients) images(endpoint string) forkboxv1connect.ImageServiceClient {
	n.mu.Lock()
	defer n.mu.Unlock()
	c, ok := n.imgs[endpoint]
	if !ok {
		c = forkboxv1connect.NewImageServiceClient(&http.Client{Transport: n.tr}, "http://"+endpoint,
			connect.WithInterceptors(nodeAuth{n.token}), connect.WithSendMaxBytes(MaxRequestBytes))
		n.imgs[endpoint] = c
	}
	return c
}

func (n *nodeClients) close() { n.tr.CloseIdleConnections() }

// nodeAuth sets the nodes' bearer token on every request to a node.
type nodeAuth struct{ token string }

func (a nodeAuth) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		req.Header().Set("Authorization", "Bearer "+a.token)
		return next(ctx, req)
	}
}

func (a nodeAuth) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		conn := next(ctx, spec)
		conn.RequestHeader().Set("Authorization", "Bearer "+a.token)
		return conn
	}
}

func (a nodeAuth) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

// route is where a sandbox-scoped call goes: the node's client and the
// sandbox's local ID there.
type route struct {
	c   forkboxv1connect.SandboxServiceClient
	id  string
	obj *fbv1.Sandbox
}

// route finds the sandbox ref names and the API of the node that runs it.
func (g *Gateway) route(ctx context.Context, ref string) (*route, error) {
	sb, err := g.sandbox(ctx, ref)
	if err != nil {
		return nil, err
	}
	return g.routeTo(ctx, sb)
}

func (g *Gateway) routeTo(ctx context.Context, sb *fbv1.Sandbox) (*route, error) {
	switch {
	case sb.Closed():
		// As one host answers a call on a closed sandbox.
		return nil, fmt.Errorf("sandbox %s is closed: %w", publicID(sb), errdefs.ErrFailedPrecondition)
	case sb.Spec.State == fbv1.StateClosed:
		return nil, fmt.Errorf("sandbox %s is closing: %w", publicID(sb), errdefs.ErrFailedPrecondition)
	case sb.Status.Phase == fbv1.PhaseLost:
		return nil, fmt.Errorf("sandbox %s: its node %s is lost: %s: %w", sb.Name, sb.Spec.NodeName, sb.Status.Message, errdefs.ErrUnavailable)
	case sb.Spec.NodeName == "" || sb.Status.LocalID == "":
		return nil, fmt.Errorf("sandbox %s is not running on a node yet (phase %q): %w", sb.Name, sb.Status.Phase, errdefs.ErrFailedPrecondition)
	}
	ep, err := g.endpoint(ctx, sb.Spec.NodeName)
	if err != nil {
		return nil, err
	}
	return &route{c: g.nodes.get(ep), id: sb.Status.LocalID, obj: sb}, nil
}

// routeLedger is route for the reads of a sandbox's record on its node
// (its ledger: events, credentials' names), which a closed sandbox keeps
// there: they go to the node that ran it (spec.nodeName). A node that is
// gone or not ready makes them Unavailable, saying so.
func (g *Gateway) routeLedger(ctx context.Context, ref string) (*route, error) {
	sb, err := g.sandbox(ctx, ref)
	if err != nil {
		return nil, err
	}
	if !sb.Closed() && sb.Spec.State != fbv1.StateClosed {
		return g.routeTo(ctx, sb)
	}
	node := sb.Spec.NodeName
	if node == "" || sb.Status.LocalID == "" {
		return nil, fmt.Errorf("sandbox %s was closed before it ran on a node: it has no ledger: %w", sb.Name, errdefs.ErrFailedPrecondition)
	}
	var n fbv1.ForkboxNode
	if err := g.c.Get(ctx, types.NamespacedName{Name: node}, &n); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("sandbox %s is closed and its ledger is on node %s, which is gone from the cluster: %w", publicID(sb), node, errdefs.ErrUnavailable)
		}
		return nil, kerr(err, "node "+node)
	}
	if c := meta.FindStatusCondition(n.Status.Conditions, fbv1.ConditionReady); c == nil || c.Status != metav1.ConditionTrue {
		why := "it has not reported ready"
		if c != nil {
			why = c.Reason + ": " + c.Message
		}
		return nil, fmt.Errorf("sandbox %s is closed and its ledger is on node %s, which is not ready (%s): %w", publicID(sb), node, why, errdefs.ErrUnavailable)
	}
	ep, err := g.endpoint(ctx, node)
	if err != nil {
		return nil, err
	}
	return &route{c: g.nodes.get(ep), id: sb.Status.LocalID, obj: sb}, nil
}

// endpoint is the API address a node registered.
func (g *Gateway) endpoint(ctx context.Context, node string) (string, error) {
	var n fbv1.ForkboxNode
	if err := g.c.Get(ctx, types.NamespacedName{Name: node}, &n); err != nil {
		return "", kerr(err, "node "+node)
	}
	ep := n.Spec.Endpoint
	if host, port, err := net.SplitHostPort(ep); err != nil || host == "" || port == "" || port == "0" {
		return "", fmt.Errorf("node %s registered no usable API endpoint (%q; start it with --tcp and --node-endpoint): %w", node, ep, errdefs.ErrUnavailable)
	}
	return ep, nil
}
