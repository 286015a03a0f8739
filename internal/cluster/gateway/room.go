package gateway

import (
	"context"
	"fmt"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/forkbox/forkbox/errdefs"
	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
	"github.com/forkbox/forkbox/internal/cluster/kube"
)

// roomFor refuses n children of a fork that is not best effort when the
// cluster has fewer than n free slots, before anything is made: as on one
// host, where such a fork is one ResourceExhausted error ("N forks need N
// free slots"), and only a best-effort one starts what fits, its other
// children failing one by one. Free slots are counted as the placer counts
// them (a Ready, schedulable node's slots less the sandboxes bound to it
// that hold one: fbv1.Sandbox.HoldsSlot), from the gateway's view: its namespace's
// sandboxes. Another tenant's are not seen, so a fork that passes may
// still find less room, and those of its children fail one by one; one
// that is refused would not have fitted.
//
// The count is from the gateway's cache, and a refusal is counted again from
// the API server: the cache can be a write behind an uncordon or a closed
// sandbox, and a fork made after either must see it.
func (g *Gateway) roomFor(ctx context.Context, n int, bestEffort bool) error {
	if bestEffort {
		return nil
	}
	free, err := g.freeSlots(ctx, g.c)
	if err == nil && free < n {
		free, err = g.freeSlots(ctx, g.api)
	}
	if err != nil {
		return err
	}
	if free < n {
		return fmt.Errorf("%d slots needed, %d free on the cluster's ready nodes (best_effort starts as many as fit): %w", n, free, errdefs.ErrResourceExhausted)
	}
	return nil
}

// freeSlots counts the free slots of Ready, schedulable nodes as r shows
// them.
func (g *Gateway) freeSlots(ctx context.Context, r client.Reader) (int, error) {
	var nl fbv1.ForkboxNodeList
	if err := r.List(ctx, &nl); err != nil {
		return 0, kerr(err, "list nodes")
	}
	var sl fbv1.SandboxList
	if err := r.List(ctx, &sl, client.InNamespace(g.o.Namespace)); err != nil {
		return 0, kerr(err, "list sandboxes")
	}
	used := map[string]int{}
	for _, sb := range sl.Items {
		if sb.Spec.NodeName != "" && sb.HoldsSlot() {
			used[sb.Spec.NodeName]++
		}
	}
	free := 0
	for _, nd := range nl.Items {
		if kube.IsTrue(nd.Status.Conditions, fbv1.ConditionReady) && !nd.Spec.Unschedulable {
			free += max(int(nd.Status.Allocatable.Slots)-used[nd.Name], 0)
		}
	}
	return free, nil
}
