package nodeagent

import (
	"context"
	"fmt"
	"slices"
	"strings"

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
// Ancestry is each Checkpoint's spec.parent, which its creator (the
// gateway or the controller) records from its sandbox's spec.source,
// never status.parent as a node wrote it: a node that captured X could
// otherwise claim any checkpoint V as X's parent and be served V.
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
	var named []*fbv1.Checkpoint // the Checkpoints that name id as this node's copy
	byName := map[types.NamespacedName]*fbv1.Checkpoint{}
	for i := range cl.Items {
		c := &cl.Items[i]
		byName[client.ObjectKeyFromObject(c)] = c
		if slices.ContainsFunc(c.Status.Replicas, func(rp fbv1.Replica) bool { return rp.Node == g.node && rp.LocalID == id }) {
			named = append(named, c)
		}
	}
	ck, why := g.copyOf(id, named)
	if ck == nil {
		return transfer.Denied(peer, id, why)
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
			src = c.Spec.Parent
		}
	}
	return transfer.Denied(peer, what, "no sandbox placed on node "+peer+" starts from it")
}

// copyOf is the one Checkpoint whose copy on this node id is, among
// named (those with an entry of this node naming id), or nil and why
// not. Only this node writes its own entries of status.replicas (the
// node identity policy refuses any other node), so an entry of this
// node is what this node recorded: its capture, when it is the
// Checkpoint's capturing node (spec.nodeName, which no node sets) and
// origin, or its pull otherwise. Still, a local checkpoint is one
// Checkpoint's copy: an ID named by two Checkpoints (a bug, or a
// record this node did not make, by the controller or an admin) is
// refused rather than resolved to one of them, for the grant would then
// be judged on a Checkpoint that may not be what is sent. A capture
// entry whose Checkpoint says another node captured it
// (status.originNode) is refused for the same reason.
func (g placementGrants) copyOf(id string, named []*fbv1.Checkpoint) (*fbv1.Checkpoint, string) {
	switch {
	case len(named) == 0:
		return nil, "no Checkpoint names it as node " + g.node + "'s copy"
	case len(named) > 1:
		names := make([]string, len(named))
		for i, c := range named {
			names[i] = c.Namespace + "/" + c.Name
		}
		slices.Sort(names)
		return nil, fmt.Sprintf("%d Checkpoints name it as node %s's copy (%s): which one is ambiguous", len(named), g.node, strings.Join(names, ", "))
	}
	ck := named[0]
	if ck.Spec.NodeName == g.node && ck.Status.OriginNode != g.node {
		return nil, fmt.Sprintf("%s/%s was to be captured on node %s but says node %q captured it", ck.Namespace, ck.Name, g.node, ck.Status.OriginNode)
	}
	for _, rp := range ck.Status.Replicas {
		if rp.Node == g.node && rp.LocalID == id && !rp.Ready {
			return nil, "node " + g.node + "'s copy in " + ck.Namespace + "/" + ck.Name + " is not ready"
		}
	}
	return ck, ""
}
