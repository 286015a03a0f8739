package gateway

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"connectrpc.com/connect"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/forkbox/forkbox/api/forkbox/v1"
	"github.com/forkbox/forkbox/errdefs"
	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
	"github.com/forkbox/forkbox/internal/cluster/controller"
)

// A warm pool in cluster mode is the controller's (package controller,
// pools): spec.poolSize Sandboxes of the environment's checkpoint,
// labelled fbv1.PoolLabel. A handover takes the oldest ready one out of
// the pool with one write: its pool label and controller reference go
// and a handed-over annotation comes, under an optimistic lock (the
// resource version it was read at), so of two callers that read the same
// member one gets it and the other a conflict, and tries the next. The
// taken Sandbox is then an ordinary one, its caller's: it outlives the
// environment, and the controller refills the pool. A member never had a
// tenant before (it is fresh from the checkpoint) and a handed-over one
// never goes back. As on one host, a call that names its sandbox or
// changes what the sandbox is (resources, env, cwd, egress) is not
// served from the pool; one that only sets a timeout is, the timeout set
// on its node after the handover.

// maxClaimTries bounds how many members one handover tries before it
// falls back to a fresh sandbox (each failed try is a member another
// caller took meanwhile).
const maxClaimTries = 8

// poolable reports whether a handover of sb (the overrides' object) and
// name may come from a pool: nothing in it differs from a member's spec.
func poolable(sb *fbv1.Sandbox, name string) bool {
	s := &sb.Spec
	r := s.Resources
	return name == "" && r.CPU == nil && r.Memory == nil && r.Disk == nil && r.Pids == nil && len(s.Env) == 0 &&
		s.WorkingDir == "" && s.Egress == nil
}

// members lists e's pool members that can be handed over now, oldest
// first, from the cache.
func (g *Gateway) members(ctx context.Context, e *fbv1.Environment) ([]fbv1.Sandbox, error) {
	var l fbv1.SandboxList
	if err := g.c.List(ctx, &l, client.InNamespace(e.Namespace), client.MatchingLabels{fbv1.PoolLabel: e.Name}); err != nil {
		return nil, kerr(err, "list the warm pool of environment "+e.Name)
	}
	out := slices.DeleteFunc(l.Items, func(sb fbv1.Sandbox) bool { return !controller.PoolMemberReady(e, &sb) })
	slices.SortFunc(out, func(a, b fbv1.Sandbox) int {
		return cmp.Or(a.CreationTimestamp.Compare(b.CreationTimestamp.Time), cmp.Compare(a.Name, b.Name))
	})
	return out, nil
}

// poolReady counts e's pool members that can be handed over now.
func (g *Gateway) poolReady(ctx context.Context, e *fbv1.Environment) int32 {
	if e.Spec.PoolSize == 0 {
		return 0
	}
	m, err := g.members(ctx, e)
	if err != nil {
		return 0
	}
	return int32(len(m))
}

// claim takes one ready member out of e's pool for the caller, or
// returns nil when none is ready (or others took each one tried).
func (g *Gateway) claim(ctx context.Context, e *fbv1.Environment) (*fbv1.Sandbox, error) {
	if e.Spec.PoolSize == 0 {
		return nil, nil
	}
	members, err := g.members(ctx, e)
	if err != nil {
		return nil, err
	}
	for i := range members[:min(len(members), maxClaimTries)] {
		sb := &members[i]
		patch := client.MergeFromWithOptions(sb.DeepCopy(), client.MergeFromWithOptimisticLock{})
		delete(sb.Labels, fbv1.PoolLabel)
		sb.OwnerReferences = slices.DeleteFunc(sb.OwnerReferences, func(r metav1.OwnerReference) bool { return r.UID == e.UID })
		if sb.Annotations == nil {
			sb.Annotations = map[string]string{}
		}
		sb.Annotations[fbv1.HandedOverAnnotation] = time.Now().UTC().Format(time.RFC3339)
		err := g.c.Patch(ctx, sb, patch)
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			continue // another caller took it, or the controller deleted it
		}
		if err != nil {
			return nil, kerr(err, "hand over warm pool sandbox "+sb.Name)
		}
		g.log.InfoContext(ctx, "handed over from the warm pool", "environment", e.Name, "sandbox", sb.Name)
		return sb, nil
	}
	return nil, nil
}

// handOver claims a member of e's pool and answers with its node's view
// of it (its timeout set first, when timeoutMs asks for one); nil when
// the pool has none ready. A member that cannot be answered for is
// deleted: it left the pool, and its caller never heard of it.
func (g *Gateway) handOver(ctx context.Context, e *fbv1.Environment, timeoutMs int64) (*v1.Sandbox, error) {
	if timeoutMs < 0 {
		return nil, fmt.Errorf("timeout_ms %d: %w", timeoutMs, errdefs.ErrInvalidArgument)
	}
	sb, err := g.claim(ctx, e)
	if err != nil || sb == nil {
		return nil, err
	}
	r, err := g.routeTo(ctx, sb)
	var out *v1.Sandbox
	if err == nil && timeoutMs > 0 {
		var resp *connect.Response[v1.SetTimeoutResponse]
		if resp, err = r.c.SetTimeout(ctx, connect.NewRequest(&v1.SetTimeoutRequest{Sandbox: r.id, TimeoutMs: timeoutMs})); err == nil {
			out = nodeView(resp.Msg.Sandbox, sb)
		}
	} else if err == nil {
		out, err = g.nodeSandbox(ctx, sb)
	}
	if err != nil {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if derr := g.c.Delete(dctx, sb); derr != nil && !apierrors.IsNotFound(derr) {
			g.log.Warn("could not delete a warm pool sandbox whose handover failed", "sandbox", sb.Name, "err", derr)
		}
		return nil, err
	}
	return out, nil
}

// poolLeft counts the members of e's pool (e itself may be gone) that are
// not being deleted.
func (g *Gateway) poolLeft(ctx context.Context, e *fbv1.Environment) (int, error) {
	var l fbv1.SandboxList
	if err := g.c.List(ctx, &l, client.InNamespace(e.Namespace), client.MatchingLabels{fbv1.PoolLabel: e.Name}); err != nil {
		return 0, kerr(err, "list the warm pool of environment "+e.Name)
	}
	n := 0
	for i := range l.Items {
		if sb := &l.Items[i]; sb.DeletionTimestamp.IsZero() && metav1.IsControlledBy(sb, e) {
			n++
		}
	}
	return n, nil
}
