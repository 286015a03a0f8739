package gateway

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	"connectrpc.com/connect"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/forkbox/forkbox/api/forkbox/v1"
	"github.com/forkbox/forkbox/errdefs"
	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
)

// tagPattern is the CRD's rule for spec.tag.
var tagPattern = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}$`)

// Checkpoint is a Checkpoint object of the sandbox, waited for until its
// node has captured it.
func (s *sandboxes) Checkpoint(ctx context.Context, req *connect.Request[v1.CheckpointRequest]) (*connect.Response[v1.CheckpointResponse], error) {
	m := req.Msg
	if m.Tag != "" && !tagPattern.MatchString(m.Tag) {
		return nil, fmt.Errorf("tag %q: letters, digits, '_', '.', '-', at most 63, not starting with a sign: %w", m.Tag, errdefs.ErrInvalidArgument)
	}
	sb, err := s.g.sandbox(ctx, m.Sandbox)
	if err != nil {
		return nil, err
	}
	if _, err := s.g.routeTo(ctx, sb); err != nil {
		return nil, fmt.Errorf("checkpoint: %w", err)
	}
	ck := &fbv1.Checkpoint{ObjectMeta: metav1.ObjectMeta{Namespace: s.g.o.Namespace, GenerateName: sb.Name + "-ck-"},
		// The sandbox's node captures it (set here, as the controller does
		// for a Fork's: spec.nodeName is set once).
		Spec: fbv1.CheckpointSpec{Sandbox: sb.Name, Tag: m.Tag, Memory: m.Memory, NodeName: sb.Spec.NodeName, Parent: sb.Spec.SourceCheckpoint()}}
	if err := s.g.c.Create(ctx, ck); err != nil {
		return nil, kerr(err, "create checkpoint of "+sb.Name)
	}
	if err := s.g.waitCheckpoint(ctx, ck); err != nil {
		if errors.Is(err, errdefs.ErrFailedPrecondition) || errors.Is(err, errdefs.ErrDeadlineExceeded) || errors.Is(err, errdefs.ErrCanceled) {
			if derr := s.g.c.Delete(context.WithoutCancel(ctx), ck); derr != nil && !apierrors.IsNotFound(derr) {
				s.g.log.Warn("could not delete a failed checkpoint", "checkpoint", ck.Name, "err", derr)
			}
		}
		return nil, err
	}
	return connect.NewResponse(&v1.CheckpointResponse{Checkpoint: s.g.checkpointView(ctx, ck)}), nil
}

// waitCheckpoint waits until ck is Ready; Failed is FailedPrecondition.
func (g *Gateway) waitCheckpoint(ctx context.Context, ck *fbv1.Checkpoint) error {
	return g.await(ctx, "checkpoint "+ck.Name, func() (bool, string, error) {
		gone, err := g.getFresh(ctx, ck)
		if err != nil {
			return false, "", err
		}
		if gone {
			return false, "", fmt.Errorf("checkpoint %s was deleted: %w", ck.Name, errdefs.ErrNotFound)
		}
		status := fmt.Sprintf("phase %q on node %q: %s", ck.Status.Phase, ck.Spec.NodeName, ck.Status.Message)
		switch ck.Status.Phase {
		case fbv1.CheckpointReady:
			return true, status, nil
		case fbv1.CheckpointFailed:
			return false, status, fmt.Errorf("checkpoint of %s failed: %s: %w", ck.Spec.Sandbox, ck.Status.Message, errdefs.ErrFailedPrecondition)
		}
		return false, status, nil
	})
}

// checkpointID is the ID callers know a checkpoint by: the local ID of
// its origin node's copy (else of any ready copy), or its name.
func checkpointID(ck *fbv1.Checkpoint) string {
	for _, r := range ck.Status.Replicas {
		if r.Node == ck.Status.OriginNode && r.LocalID != "" {
			return r.LocalID
		}
	}
	for _, r := range ck.Status.Replicas {
		if r.Ready && r.LocalID != "" {
			return r.LocalID
		}
	}
	return ck.Name
}

func (g *Gateway) checkpointView(ctx context.Context, ck *fbv1.Checkpoint) *v1.Checkpoint {
	out := &v1.Checkpoint{Id: checkpointID(ck), SandboxName: ck.Spec.Sandbox, Tag: ck.Spec.Tag,
		CreatedAtUnixMs: capturedAt(ck).UnixMilli(), Size: ck.Status.SizeBytes, Kind: ck.Status.Kind, Image: ck.Status.Image,
		CaptureMs: float64(ck.Status.CaptureMicros) / 1000, FlushMs: float64(ck.Status.FlushMicros) / 1000}
	var sb fbv1.Sandbox
	if err := g.c.Get(ctx, types.NamespacedName{Namespace: ck.Namespace, Name: ck.Spec.Sandbox}, &sb); err == nil {
		out.SandboxId = sb.Status.LocalID
	}
	return out
}

// ListCheckpoints lists the Ready Checkpoints of a sandbox (its forks'
// included), oldest first.
func (s *sandboxes) ListCheckpoints(ctx context.Context, req *connect.Request[v1.ListCheckpointsRequest]) (*connect.Response[v1.ListCheckpointsResponse], error) {
	name := req.Msg.Sandbox
	sb, err := s.g.sandbox(ctx, name)
	var since metav1.Time // a live sandbox's checkpoints are not older than it: not those of an earlier one of its name
	switch {
	case err == nil:
		name, since = sb.Name, sb.CreationTimestamp
	case errdefs.IsNotFound(err) && !strings.HasPrefix(name, "sb-"):
		// A deleted sandbox's checkpoints stay; its name still lists them.
	default:
		return nil, err
	}
	size := int(req.Msg.PageSize)
	if size <= 0 || size > 1000 {
		size = map[bool]int{true: 100, false: 1000}[size <= 0]
	}
	after, err := parsePageToken(req.Msg.PageToken)
	if err != nil {
		return nil, err
	}
	cks, err := s.g.readyCheckpoints(ctx, name, since)
	if err != nil {
		return nil, err
	}
	out := &v1.ListCheckpointsResponse{}
	var last *fbv1.Checkpoint
	for i := range cks {
		ck := &cks[i]
		if after != nil && !after.beforeAt(capturedAt(ck).UnixMicro(), ck.Name) {
			continue
		}
		if len(out.Checkpoints) == size {
			out.NextPageToken = pageToken(capturedAt(last).UnixMicro(), last.Name)
			break
		}
		out.Checkpoints = append(out.Checkpoints, s.g.checkpointView(ctx, ck))
		last = ck
	}
	return connect.NewResponse(out), nil
}

// readyCheckpoints are the Ready Checkpoints of the sandbox named name (its
// forks' included) not older than since and not being deleted, oldest
// first.
func (g *Gateway) readyCheckpoints(ctx context.Context, name string, since metav1.Time) ([]fbv1.Checkpoint, error) {
	var l fbv1.CheckpointList
	if err := g.c.List(ctx, &l, client.InNamespace(g.o.Namespace), client.MatchingFields{checkpointSandboxes: name}); err != nil {
		return nil, kerr(err, "list checkpoints")
	}
	return readyOldestFirst(l.Items, since), nil
}

// readyOldestFirst keeps the Ready checkpoints of cks not older than since
// and not being deleted, and orders them by capture, then name.
func readyOldestFirst(cks []fbv1.Checkpoint, since metav1.Time) []fbv1.Checkpoint {
	cks = slices.DeleteFunc(cks, func(ck fbv1.Checkpoint) bool {
		return ck.Status.Phase != fbv1.CheckpointReady || ck.CreationTimestamp.Before(&since) || !ck.DeletionTimestamp.IsZero()
	})
	slices.SortFunc(cks, func(a, b fbv1.Checkpoint) int {
		if c := capturedAt(&a).Compare(capturedAt(&b)); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
	return cks
}

// capturedAt is when ck was captured, as its node recorded it; the
// object's creation (whole seconds) for one captured before nodes did.
func capturedAt(ck *fbv1.Checkpoint) time.Time {
	if ck.Status.CapturedAt != nil {
		return ck.Status.CapturedAt.Time
	}
	return ck.CreationTimestamp.Time
}

// DeleteCheckpoint deletes the object and waits until every node has
// removed its copy.
func (s *sandboxes) DeleteCheckpoint(ctx context.Context, req *connect.Request[v1.DeleteCheckpointRequest]) (*connect.Response[v1.DeleteCheckpointResponse], error) {
	ck, err := s.g.checkpoint(ctx, req.Msg.Checkpoint)
	if err != nil {
		return nil, err
	}
	if err := s.g.c.Delete(ctx, ck); err != nil && !apierrors.IsNotFound(err) {
		return nil, kerr(err, "delete checkpoint "+ck.Name)
	}
	err = s.g.await(ctx, "checkpoint "+ck.Name+" to be deleted", func() (bool, string, error) {
		gone, err := s.g.getFresh(ctx, ck)
		return gone, fmt.Sprintf("replicas %v", ck.Status.Replicas), err
	})
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&v1.DeleteCheckpointResponse{}), nil
}
