package controller

import (
	"context"
	"log/slog"
	"slices"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
	"github.com/forkbox/forkbox/internal/cluster/kube"
)

// checkpoints sends a Checkpoint to its sandbox's node (spec.nodeName,
// set once, with spec.parent, the checkpoint the sandbox started from),
// and releases the finalizer of a deleted one whose holders
// are all gone from the cluster.
type checkpoints struct {
	c         client.Client
	log       *slog.Logger
	retry     time.Duration
	namespace string // the nodes' Leases
}

func (r *checkpoints) setup(mgr ctrl.Manager) error {
	// A node that goes (its object, its Lease) may have been the last
	// holder of a deleted checkpoint: nothing else changes that
	// checkpoint then.
	held := handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
		var l fbv1.CheckpointList
		if err := r.c.List(ctx, &l); err != nil {
			return nil
		}
		return requests(slices.DeleteFunc(ptrs(l.Items), func(ck *fbv1.Checkpoint) bool {
			return ck.DeletionTimestamp.IsZero() || !slices.Contains(holders(ck), o.GetName())
		}))
	})
	return ctrl.NewControllerManagedBy(mgr).Named("checkpoints").For(&fbv1.Checkpoint{}).
		Watches(&fbv1.ForkboxNode{}, held, builder.WithPredicates(deleted)).
		Watches(&coordinationv1.Lease{}, held, builder.WithPredicates(deleted)).
		Complete(r)
}

func (r *checkpoints) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var ck fbv1.Checkpoint
	if err := r.c.Get(ctx, req.NamespacedName, &ck); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if !ck.DeletionTimestamp.IsZero() {
		return r.releaseOrphan(ctx, &ck)
	}
	if ck.Spec.NodeName != "" || ck.Status.Phase != "" && ck.Status.Phase != fbv1.CheckpointPending {
		return reconcile.Result{}, nil
	}
	var sb fbv1.Sandbox
	if err := r.c.Get(ctx, types.NamespacedName{Namespace: ck.Namespace, Name: ck.Spec.Sandbox}, &sb); err != nil {
		if errors.IsNotFound(err) {
			return reconcile.Result{}, r.fail(ctx, &ck, "sandbox "+ck.Spec.Sandbox+" does not exist")
		}
		return reconcile.Result{}, err
	}
	if sb.Spec.NodeName == "" {
		return reconcile.Result{RequeueAfter: r.retry}, nil // its sandbox is not placed yet
	}
	patch := client.MergeFromWithOptions(ck.DeepCopy(), client.MergeFromWithOptimisticLock{})
	ck.Spec.NodeName = sb.Spec.NodeName
	if ck.Spec.Parent == "" { // what grants and placement trust as its descent
		ck.Spec.Parent = sb.Spec.SourceCheckpoint()
	}
	return reconcile.Result{}, r.c.Patch(ctx, &ck, patch)
}

func (r *checkpoints) fail(ctx context.Context, ck *fbv1.Checkpoint, msg string) error {
	patch := client.MergeFrom(ck.DeepCopy())
	ck.Status.Phase, ck.Status.Message = fbv1.CheckpointFailed, kube.Truncate(msg, 4096)
	kube.SetCondition(&ck.Status.Conditions, fbv1.ConditionReady, false, "SourceMissing", msg, ck.Generation)
	return r.c.Status().Patch(ctx, ck, patch)
}

// holders are the nodes whose agents remove a copy of ck: those its
// replicas name, and its capturing node while the capture is not done (a
// done one is in the replicas while it holds a copy).
func holders(ck *fbv1.Checkpoint) []string {
	var out []string
	if ck.Spec.NodeName != "" && ck.Status.Phase != fbv1.CheckpointReady && ck.Status.Phase != fbv1.CheckpointFailed {
		out = append(out, ck.Spec.NodeName)
	}
	for _, rp := range ck.Status.Replicas {
		if rp.Node != "" && !slices.Contains(out, rp.Node) {
			out = append(out, rp.Node)
		}
	}
	return out
}

// releaseOrphan removes the replicas finalizer when every node that holds
// a copy (or would capture one) has left the cluster (nodeGone): the
// copies of those nodes went with them, and their agents, which would
// remove the entries, are gone too.
func (r *checkpoints) releaseOrphan(ctx context.Context, ck *fbv1.Checkpoint) (reconcile.Result, error) {
	if !controllerutil.ContainsFinalizer(ck, fbv1.CheckpointFinalizer) {
		return reconcile.Result{}, nil
	}
	gone, wait, err := holdersGone(ctx, r.c, r.namespace, holders(ck))
	if err != nil || !gone {
		return reconcile.Result{RequeueAfter: wait}, err
	}
	patch := client.MergeFrom(ck.DeepCopy())
	controllerutil.RemoveFinalizer(ck, fbv1.CheckpointFinalizer)
	return reconcile.Result{}, client.IgnoreNotFound(r.c.Patch(ctx, ck, patch))
}
