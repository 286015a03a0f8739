package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strings"

	"connectrpc.com/connect"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/forkbox/forkbox/api/forkbox/v1"
	"github.com/forkbox/forkbox/errdefs"
	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
)

// The calls below run on the sandbox's node: the request goes there as it
// came (its sandbox field set to the local ID when the caller named the
// sandbox), the answer comes back as the node gave it, errors included.

// routeLive is route for calls that need the sandbox running: a
// hibernated one is woken through its object first, since the node
// would wake it for the call and its agent hibernate it again after.
func (g *Gateway) routeLive(ctx context.Context, ref string) (*route, error) {
	r, err := g.route(ctx, ref)
	if err != nil || r.obj.Spec.State != fbv1.StateHibernated {
		return r, err
	}
	if _, err := g.setState(ctx, ref, fbv1.StateRunning, fbv1.PhaseRunning, "wake"); err != nil {
		return nil, err
	}
	return g.route(ctx, ref)
}

// pump forwards a node's server stream to the caller.
func pump[T any](from *connect.ServerStreamForClient[T], to *connect.ServerStream[T]) error {
	defer from.Close()
	for from.Receive() {
		if err := to.Send(from.Msg()); err != nil {
			return err
		}
	}
	return from.Err()
}

func (s *sandboxes) Exec(ctx context.Context, req *connect.Request[v1.ExecRequest], stream *connect.ServerStream[v1.ExecResponse]) error {
	r, err := s.g.routeLive(ctx, req.Msg.Sandbox)
	if err != nil {
		return err
	}
	req.Msg.Sandbox = r.id
	st, err := r.c.Exec(ctx, connect.NewRequest(req.Msg))
	if err != nil {
		return err
	}
	return pump(st, stream)
}

func (s *sandboxes) CopyFrom(ctx context.Context, req *connect.Request[v1.CopyFromRequest], stream *connect.ServerStream[v1.CopyFromResponse]) error {
	r, err := s.g.routeLive(ctx, req.Msg.Sandbox)
	if err != nil {
		return err
	}
	req.Msg.Sandbox = r.id
	st, err := r.c.CopyFrom(ctx, connect.NewRequest(req.Msg))
	if err != nil {
		return err
	}
	return pump(st, stream)
}

// CopyTo forwards the header, then each data message as it comes; the
// node bounds the stream (its --max-copy-size), as on one host.
func (s *sandboxes) CopyTo(ctx context.Context, stream *connect.ClientStream[v1.CopyToRequest]) (*connect.Response[v1.CopyToResponse], error) {
	if !stream.Receive() {
		if err := stream.Err(); err != nil {
			return nil, err
		}
		return nil, fmt.Errorf("copy: no header message: %w", errdefs.ErrInvalidArgument)
	}
	first := stream.Msg()
	h := first.GetHeader()
	if h == nil {
		return nil, fmt.Errorf("copy: the first message must be the header: %w", errdefs.ErrInvalidArgument)
	}
	r, err := s.g.routeLive(ctx, h.Sandbox)
	if err != nil {
		return nil, err
	}
	h.Sandbox = r.id
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	up := r.c.CopyTo(ctx)
	err = up.Send(first)
	for err == nil && stream.Receive() {
		err = up.Send(stream.Msg())
	}
	if err == nil {
		err = stream.Err()
	}
	if err != nil && !errors.Is(err, io.EOF) {
		cancel()
		up.CloseAndReceive()
		return nil, err
	}
	// io.EOF from Send: the node ended the call; its answer says why.
	resp, err := up.CloseAndReceive()
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(resp.Msg), nil
}

func (s *sandboxes) ReadFile(ctx context.Context, req *connect.Request[v1.ReadFileRequest]) (*connect.Response[v1.ReadFileResponse], error) {
	r, err := s.g.routeLive(ctx, req.Msg.Sandbox)
	if err != nil {
		return nil, err
	}
	req.Msg.Sandbox = r.id
	resp, err := r.c.ReadFile(ctx, connect.NewRequest(req.Msg))
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(resp.Msg), nil
}

func (s *sandboxes) WriteFile(ctx context.Context, req *connect.Request[v1.WriteFileRequest]) (*connect.Response[v1.WriteFileResponse], error) {
	r, err := s.g.routeLive(ctx, req.Msg.Sandbox)
	if err != nil {
		return nil, err
	}
	req.Msg.Sandbox = r.id
	resp, err := r.c.WriteFile(ctx, connect.NewRequest(req.Msg))
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(resp.Msg), nil
}

func (s *sandboxes) ListFiles(ctx context.Context, req *connect.Request[v1.ListFilesRequest]) (*connect.Response[v1.ListFilesResponse], error) {
	r, err := s.g.routeLive(ctx, req.Msg.Sandbox)
	if err != nil {
		return nil, err
	}
	req.Msg.Sandbox = r.id
	resp, err := r.c.ListFiles(ctx, connect.NewRequest(req.Msg))
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(resp.Msg), nil
}

// Events reads the ledger on the sandbox's node, a closed sandbox's too.
func (s *sandboxes) Events(ctx context.Context, req *connect.Request[v1.EventsRequest]) (*connect.Response[v1.EventsResponse], error) {
	r, err := s.g.routeLedger(ctx, req.Msg.Sandbox)
	if err != nil {
		return nil, err
	}
	req.Msg.Sandbox = r.id
	resp, err := r.c.Events(ctx, connect.NewRequest(req.Msg))
	if err != nil {
		return nil, err
	}
	for _, e := range resp.Msg.Events {
		e.DataJson = userTags(e.DataJson)
	}
	return connect.NewResponse(resp.Msg), nil
}

// localTagSuffix is what a node appends to a Checkpoint's tag in its
// ledger (kube.LocalCheckpointTag): the object's UID, which binds it.
var localTagSuffix = regexp.MustCompile(`@k8s-[0-9a-f-]{36}$`)

// userTags shows the checkpoint tags in an event's data as the user gave
// them: without the suffix that binds them to their object.
func userTags(data string) string {
	if !strings.Contains(data, "@k8s-") {
		return data
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(data), &m); err != nil {
		return data
	}
	changed := false
	for k, v := range m {
		if s, ok := v.(string); ok && (k == "tag" || strings.HasSuffix(k, "_tag")) && localTagSuffix.MatchString(s) {
			m[k], changed = localTagSuffix.ReplaceAllString(s, ""), true
		}
	}
	if !changed {
		return data
	}
	b, err := json.Marshal(m)
	if err != nil {
		return data
	}
	return string(b)
}

func (s *sandboxes) ListCredentials(ctx context.Context, req *connect.Request[v1.ListCredentialsRequest]) (*connect.Response[v1.ListCredentialsResponse], error) {
	r, err := s.g.routeLedger(ctx, req.Msg.Sandbox)
	if err != nil {
		return nil, err
	}
	req.Msg.Sandbox = r.id
	resp, err := r.c.ListCredentials(ctx, connect.NewRequest(req.Msg))
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(resp.Msg), nil
}

// SetTimeout is not in the Sandbox object (its node keeps the deadline),
// so it only goes to the node.
func (s *sandboxes) SetTimeout(ctx context.Context, req *connect.Request[v1.SetTimeoutRequest]) (*connect.Response[v1.SetTimeoutResponse], error) {
	r, err := s.g.route(ctx, req.Msg.Sandbox)
	if err != nil {
		return nil, err
	}
	req.Msg.Sandbox = r.id
	resp, err := r.c.SetTimeout(ctx, connect.NewRequest(req.Msg))
	if err != nil {
		return nil, err
	}
	resp.Msg.Sandbox = nodeView(resp.Msg.Sandbox, r.obj)
	return connect.NewResponse(resp.Msg), nil
}

// SetEgress is applied by the node (which checks and canonicalises the
// policy), then written to the object's spec.egress as the node holds
// it, so the object says what runs and its agent never undoes it.
func (s *sandboxes) SetEgress(ctx context.Context, req *connect.Request[v1.SetEgressRequest]) (*connect.Response[v1.SetEgressResponse], error) {
	m := req.Msg
	if len(m.EgressAllow) > maxEgress || len(m.EgressDeny) > maxEgress {
		return nil, fmt.Errorf("egress lists of %d and %d entries: at most %d: %w", len(m.EgressAllow), len(m.EgressDeny), maxEgress, errdefs.ErrInvalidArgument)
	}
	r, err := s.g.route(ctx, m.Sandbox)
	if err != nil {
		return nil, err
	}
	m.Sandbox = r.id
	resp, err := r.c.SetEgress(ctx, connect.NewRequest(m))
	if err != nil {
		return nil, err
	}
	got := resp.Msg.Sandbox
	eg := &fbv1.Egress{Mode: got.GetEgress(), Allow: got.GetEgressAllow(), Deny: got.GetEgressDeny()}
	if err := s.g.recordEgress(ctx, r.obj, eg); err != nil {
		return nil, kerr(err, "record the egress policy on sandbox "+r.obj.Name+" (the node applied it)")
	}
	resp.Msg.Sandbox = nodeView(got, r.obj)
	return connect.NewResponse(resp.Msg), nil
}

// recordEgress writes eg to sb's spec.egress against the API server's
// copy (editSpec). A patch computed from a cached copy a write behind would
// leave out what the cache already "has": a policy set back to what the
// cache shows was not recorded.
func (g *Gateway) recordEgress(ctx context.Context, sb *fbv1.Sandbox, eg *fbv1.Egress) error {
	return g.editSpec(ctx, sb, func(sb *fbv1.Sandbox) error {
		sb.Spec.Egress = eg
		return nil
	})
}

// GetSandboxMetrics of one sandbox asks its node; of every sandbox, asks
// each node that runs some of this namespace's and keeps only those: a
// caller never sees another tenant's sandboxes (nor a warm pool's).
func (s *sandboxes) GetSandboxMetrics(ctx context.Context, req *connect.Request[v1.GetSandboxMetricsRequest]) (*connect.Response[v1.GetSandboxMetricsResponse], error) {
	if req.Msg.Sandbox != "" {
		r, err := s.g.route(ctx, req.Msg.Sandbox)
		if err != nil {
			return nil, err
		}
		resp, err := r.c.GetSandboxMetrics(ctx, connect.NewRequest(&v1.GetSandboxMetricsRequest{Sandbox: r.id}))
		if err != nil {
			return nil, err
		}
		for _, m := range resp.Msg.Metrics {
			m.Name = r.obj.Name
		}
		return connect.NewResponse(resp.Msg), nil
	}
	var l fbv1.SandboxList
	if err := s.g.c.List(ctx, &l, client.InNamespace(s.g.o.Namespace)); err != nil {
		return nil, kerr(err, "list sandboxes")
	}
	byNode := map[string]map[string]string{} // node → local ID → name
	for _, sb := range l.Items {
		if sb.Spec.NodeName == "" || sb.Status.LocalID == "" || sb.Closed() || sb.Labels[fbv1.PoolLabel] != "" {
			continue // not on a node yet, closed (no counters; its node may be gone), or waiting in a warm pool (as the daemon leaves those out)
		}
		if byNode[sb.Spec.NodeName] == nil {
			byNode[sb.Spec.NodeName] = map[string]string{}
		}
		byNode[sb.Spec.NodeName][sb.Status.LocalID] = sb.Name
	}
	out := &v1.GetSandboxMetricsResponse{}
	for node, mine := range byNode {
		ep, err := s.g.endpoint(ctx, node)
		if err != nil {
			return nil, err
		}
		resp, err := s.g.nodes.get(ep).GetSandboxMetrics(ctx, connect.NewRequest(&v1.GetSandboxMetricsRequest{}))
		if err != nil {
			return nil, err
		}
		for _, m := range resp.Msg.Metrics {
			if name, ok := mine[m.SandboxId]; ok {
				m.Name = name
				out.Metrics = append(out.Metrics, m)
			}
		}
	}
	return connect.NewResponse(out), nil
}

// ExecPty pumps the terminal both ways: the caller's messages to the
// node, the node's to the caller. Either side ending ends the other;
// cancelling the call cancels the node's, which kills the session.
func (s *sandboxes) ExecPty(ctx context.Context, stream *connect.BidiStream[v1.PtyRequest, v1.PtyResponse]) error {
	first, err := stream.Receive()
	if err != nil {
		if errors.Is(err, io.EOF) {
			return fmt.Errorf("exec pty: no start message: %w", errdefs.ErrInvalidArgument)
		}
		return err
	}
	start := first.GetStart()
	if start == nil {
		return fmt.Errorf("exec pty: the first message must be start: %w", errdefs.ErrInvalidArgument)
	}
	r, err := s.g.routeLive(ctx, start.Sandbox)
	if err != nil {
		return err
	}
	start.Sandbox = r.id
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	node := r.c.ExecPty(ctx)
	if err := node.Send(first); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	upDone := make(chan struct{})
	go func() { // the caller's side, until it closes, fails or is ended below
		defer close(upDone)
		for {
			m, err := stream.Receive()
			if err != nil {
				node.CloseRequest()
				return
			}
			if err := node.Send(m); err != nil {
				return
			}
		}
	}()
	var downErr error
	for {
		m, err := node.Receive()
		if err != nil {
			if !errors.Is(err, io.EOF) {
				downErr = err
			}
			break
		}
		if err := stream.Send(m); err != nil {
			downErr = err
			break
		}
	}
	cancel()
	endReceive(ctx)
	<-upDone
	node.CloseResponse()
	return downErr
}
