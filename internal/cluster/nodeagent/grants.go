package nodeagent

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/forkbox/forkbox/errdefs"
	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
	"github.com/forkbox/forkbox/internal/transfer"
)

// placementGrants are the transfer server's Grants in cluster mode: a
// peer may pull a checkpoint of this node only when the objects give it a
// reason to hold one, the reason the placer gives a node: a Sandbox bound
// to the peer (spec.nodeName, which the placer sets once and which the
// node identity policy keeps any node from setting) that starts from the
// checkpoint, directly or through its Environment, or from a descendant
// of it (up to maxAncestry generations, as pulls look for ancestors).
// That is what makes a node pull (sandboxes.localCheckpoint): a child
// placed where its checkpoint is not. A Sandbox being deleted is no
// reason. Everything is read from the API server, not a cache: a grant
// counts from the moment the placement is stored, and ends with it.
type placementGrants struct {
	api  client.Reader
	node string // this node
}

// MayPull implements transfer.Grants; id is this node's ID of the
// checkpoint (its replica's LocalID).
func (g placementGrants) MayPull(ctx context.Context, peer, id string) error {
	var cl fbv1.CheckpointList
	if err := g.api.List(ctx, &cl); err != nil {
		return fmt.Errorf("list checkpoints: %v: %w", err, errdefs.ErrUnavailable)
	}
	var ck *fbv1.Checkpoint
	byName := map[types.NamespacedName]*fbv1.Checkpoint{}
	for i := range cl.Items {
		c := &cl.Items[i]
		byName[client.ObjectKeyFromObject(c)] = c
		for _, rp := range c.Status.Replicas {
			if rp.Node == g.node && rp.LocalID == id && rp.Ready {
				ck = c
			}
		}
	}
	if ck == nil {
		return transfer.Denied(peer, id, "no Checkpoint names it as node "+g.node+"'s copy")
	}
	what := fmt.Sprintf("%s (%s/%s)", id, ck.Namespace, ck.Name)
	var sl fbv1.SandboxList
	if err := g.api.List(ctx, &sl, client.InNamespace(ck.Namespace), client.MatchingFields{fbv1.NodeNameField: peer}); err != nil {
		return fmt.Errorf("list the sandboxes of node %s: %v: %w", peer, err, errdefs.ErrUnavailable)
	}
	envs := map[string]string{} // environment → its checkpoint
	for i := range sl.Items {
		sb := &sl.Items[i]
		if sb.Spec.NodeName != peer || sb.Spec.Source == nil || !sb.DeletionTimestamp.IsZero() {
			continue
		}
		src := sb.Spec.Source.Checkpoint
		if env := sb.Spec.Source.Environment; env != "" {
			got, seen := envs[env]
			if !seen {
				var e fbv1.Environment
				if err := g.api.Get(ctx, types.NamespacedName{Namespace: sb.Namespace, Name: env}, &e); err == nil {
					got = e.Status.Checkpoint
				} else if client.IgnoreNotFound(err) != nil {
					return fmt.Errorf("environment %s/%s: %v: %w", sb.Namespace, env, err, errdefs.ErrUnavailable)
				}
				envs[env] = got
			}
			src = got
		}
		// src, then its ancestors.
		for depth := 0; src != "" && depth <= maxAncestry; depth++ {
			if src == ck.Name {
				return nil
			}
			c := byName[types.NamespacedName{Namespace: sb.Namespace, Name: src}]
			if c == nil {
				break
			}
			src = c.Status.Parent
		}
	}
	return transfer.Denied(peer, what, "no sandbox placed on node "+peer+" starts from it")
}
