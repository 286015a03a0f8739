package controller

import (
	"context"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
)

// A deleted sandbox or checkpoint keeps its finalizer while a node that
// holds it may still act: the node agent removes its local copy, then the
// finalizer. When the node has left the cluster, nobody will, and the
// controller releases it (releaseOrphan). A node has left when its
// ForkboxNode is gone and its agent's heartbeat Lease is gone or lapsed:
// an agent that still runs makes its ForkboxNode again on its next
// heartbeat (an administrator's delete of a live node's object, a
// re-registration), and its sandboxes and checkpoints are still its to
// remove.

// nodeGone reports whether node name has left the cluster as c shows it
// (Leases in namespace); when its object is gone but its Lease is current,
// wait is how long until that Lease lapses.
func nodeGone(ctx context.Context, c client.Reader, namespace, name string) (gone bool, wait time.Duration, err error) {
	var n fbv1.ForkboxNode
	if err := c.Get(ctx, types.NamespacedName{Name: name}, &n); !errors.IsNotFound(err) {
		return false, 0, client.IgnoreNotFound(err)
	}
	var l coordinationv1.Lease
	if err := c.Get(ctx, types.NamespacedName{Namespace: namespace, Name: name}, &l); err != nil {
		if errors.IsNotFound(err) {
			return true, 0, nil
		}
		return false, 0, err
	}
	if left := time.Until(expiry(&l)); left > 0 {
		return false, left + time.Second, nil
	}
	return true, 0, nil
}

// holdersGone reports whether every one of nodes has left the cluster;
// when some may come back (their Leases current), wait is when to look
// again.
func holdersGone(ctx context.Context, c client.Reader, namespace string, nodes []string) (gone bool, wait time.Duration, err error) {
	for _, n := range nodes {
		g, w, err := nodeGone(ctx, c, namespace, n)
		if err != nil || (!g && w == 0) {
			return false, 0, err // there, or unknown: its agent removes its copy
		}
		if !g {
			wait = max(wait, w)
		}
	}
	return wait == 0, wait, nil
}
