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
// member one gets it and the other a conflict; the other reads it again,
// finds it taken, and tries the next. The
// taken Sandbox is then an ordinary one, its caller's: it outlives the
// environment, and the controller refills the pool. A member never had a
// tenant before (it is fresh from the checkpoint) and a handed-over one
// never goes back. As on one host, a call that names its sandbox or
// changes what the sandbox is (resources, env, cwd, egress) is not
// served from the pool; one that only sets a timeout is, the timeout set
// on its node after the handover.

// maxClaimTries bounds how many writes one handover tries before it
// falls back to a fresh sandbox (each failed try is a member another
// caller took, or wrote to, meanwhile).
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
// returns nil when none is ready (or others took each one tried). The
// members come from the cache, which may be a write behind: a conflict
// means another caller took the member or anything else wrote to it (its
// node's status report), so the member is read again from the API server
// and tried again while it is still a ready member.
func (g *Gateway) claim(ctx context.Context, e *fbv1.Environment) (*fbv1.Sandbox, error) {
	if e.Spec.PoolSize == 0 {
		return nil, nil
	}
	members, err := g.members(ctx, e)
	if err != nil {
		return nil, err
	}
	tries := 0
	for i := 0; i < len(members) && tries < maxClaimTries; tries++ {
		sb := &members[i]
		err := g.take(ctx, e, sb)
		switch {
		case err == nil:
			g.log.InfoContext(ctx, "handed over from the warm pool", "environment", e.Name, "sandbox", sb.Name)
			return sb, nil
		case apierrors.IsNotFound(err):
			i++ // the controller deleted it
		case apierrors.IsConflict(err):
			var cur fbv1.Sandbox
			if gerr := g.api.Get(ctx, client.ObjectKeyFromObject(sb), &cur); gerr != nil || !controller.PoolMemberReady(e, &cur) {
				if gerr != nil && !apierrors.IsNotFound(gerr) {
					g.log.WarnContext(ctx, "warm pool member not read again; trying the next", "sandbox", sb.Name, "err", gerr)
				}
				i++ // another caller took it, or it left the pool
			} else {
				members[i] = cur // written to meanwhile: try it as it is now
			}
		default:
			return nil, kerr(err, "hand over warm pool sandbox "+sb.Name)
		}
	}
	return nil, nil
}

// take writes sb out of e's pool, under an optimistic lock on the
// resource version sb was read at.
func (g *Gateway) take(ctx context.Context, e *fbv1.Environment, sb *fbv1.Sandbox) error {
	patch := client.MergeFromWithOptions(sb.DeepCopy(), client.MergeFromWithOptimisticLock{})
	delete(sb.Labels, fbv1.PoolLabel)
	sb.OwnerReferences = slices.DeleteFunc(sb.OwnerReferences, func(r metav1.OwnerReference) bool { return r.UID == e.UID })
	if sb.Annotations == nil {
		sb.Annotations = map[string]string{}
	}
	sb.Annotations[fbv1.HandedOverAnnotation] = time.Now().UTC().Format(time.RFC3339)
	return g.c.Patch(ctx, sb, patch)
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
