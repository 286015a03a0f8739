package nodeagent

import (
	"context"
	"fmt"
	"log/slog"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/forkbox/forkbox/errdefs"
	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
	"github.com/forkbox/forkbox/internal/cluster/kube"
	"github.com/forkbox/forkbox/internal/store"
)

// checkpoints captures the Checkpoints bound to this node from their
// local sandbox, and deletes this node's copy when one is deleted.
type checkpoints struct{ *agent }

func (r *checkpoints) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var ck fbv1.Checkpoint
	if err := r.c.Get(ctx, req.NamespacedName, &ck); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if ck.Spec.NodeName != r.o.NodeName {
		return reconcile.Result{}, nil
	}
	if !ck.DeletionTimestamp.IsZero() {
		return reconcile.Result{}, r.remove(ctx, &ck)
	}
	if ck.Status.Phase == fbv1.CheckpointReady || ck.Status.Phase == fbv1.CheckpointFailed {
		return reconcile.Result{}, nil
	}
	if !controllerutil.ContainsFinalizer(&ck, fbv1.CheckpointFinalizer) {
		patch := client.MergeFrom(ck.DeepCopy())
		controllerutil.AddFinalizer(&ck, fbv1.CheckpointFinalizer)
		if err := r.c.Patch(ctx, &ck, patch); err != nil {
			return reconcile.Result{}, err
		}
	}
	before := ck.DeepCopy()
	local, sb, err := r.capture(ctx, &ck)
	if err != nil {
		r.rec.Eventf(&ck, nil, corev1.EventTypeWarning, "CaptureFailed", "Checkpoint", "%s", kube.Truncate(err.Error(), 1024))
		if !errdefs.IsInvalidArgument(err) && !errdefs.IsNotFound(err) && !errdefs.IsFailedPrecondition(err) {
			return reconcile.Result{}, err // retried with backoff
		}
		ck.Status.Phase, ck.Status.Message = fbv1.CheckpointFailed, kube.Truncate(err.Error(), 4096)
		kube.SetCondition(&ck.Status.Conditions, fbv1.ConditionReady, false, "CaptureFailed", ck.Status.Message, ck.Generation)
		return reconcile.Result{}, r.writeStatus(ctx, before, &ck)
	}
	ck.Status = fbv1.CheckpointStatus{
		Phase: fbv1.CheckpointReady, Kind: local.Kind, OriginNode: r.o.NodeName, SizeBytes: local.Size,
		Size: resource.NewQuantity(local.Size, resource.BinarySI), Image: local.Image, Runtime: fbv1.Runtime(local.Runtime),
		CaptureMicros: int64(local.CaptureMS * 1000), FlushMicros: int64(local.FlushMS * 1000),
		CapturedAt: &metav1.MicroTime{Time: local.CreatedAt},
		Replicas:   []fbv1.Replica{{Node: r.o.NodeName, LocalID: local.ID, Ready: true}},
		Conditions: ck.Status.Conditions,
	}
	// The parent is what the Checkpoint's creator recorded from the
	// sandbox's spec.source, never this node's say (the node identity
	// policy refuses any other).
	ck.Status.Parent = ck.Spec.Parent
	if ck.Status.SubvolumeUUID, err = r.d.CheckpointUUID(local.ID); err != nil {
		return reconcile.Result{}, err
	}
	kube.SetCondition(&ck.Status.Conditions, fbv1.ConditionReady, true, "Captured", "captured on node "+r.o.NodeName, ck.Generation)
	if err := r.writeStatus(ctx, before, &ck); err != nil {
		return reconcile.Result{}, err
	}
	r.log.InfoContext(ctx, "checkpoint captured", slog.String("checkpoint", ck.Namespace+"/"+ck.Name), slog.String("local", local.ID),
		slog.String("kind", local.Kind))
	r.rec.Eventf(&ck, sb, corev1.EventTypeNormal, "Captured", "Checkpoint", "%s checkpoint %s of %s", local.Kind, local.ID, sb.Status.LocalID)
	return reconcile.Result{}, nil
}

// capture returns the local checkpoint of ck, taking it unless an
// earlier attempt did (found by its tag).
func (r *checkpoints) capture(ctx context.Context, ck *fbv1.Checkpoint) (*store.Checkpoint, *fbv1.Sandbox, error) {
	var sb fbv1.Sandbox
	if err := r.c.Get(ctx, types.NamespacedName{Namespace: ck.Namespace, Name: ck.Spec.Sandbox}, &sb); err != nil {
		return nil, nil, fmt.Errorf("sandbox %s on node %s: %v: %w", ck.Spec.Sandbox, r.o.NodeName, err, errdefs.ErrFailedPrecondition)
	}
	local, err := r.d.Get(ctx, kube.LocalSandboxName(&sb))
	if err != nil {
		return nil, nil, fmt.Errorf("sandbox %s has no local sandbox on node %s: %w", sb.Name, r.o.NodeName, err)
	}
	tag := kube.LocalCheckpointTag(ck)
	cks, err := r.d.ListCheckpoints(ctx, local.ID)
	if err != nil {
		return nil, nil, err
	}
	for _, c := range cks {
		if c.Tag == tag {
			return c, &sb, nil
		}
	}
	c, err := r.d.CheckpointWith(ctx, local.ID, tag, ck.Spec.Memory)
	return c, &sb, err
}

// remove deletes this node's copy of a deleted checkpoint and drops the
// finalizer once no node holds one.
func (r *checkpoints) remove(ctx context.Context, ck *fbv1.Checkpoint) error {
	if !controllerutil.ContainsFinalizer(ck, fbv1.CheckpointFinalizer) {
		return nil
	}
	for _, rp := range ck.Status.Replicas {
		if rp.Node != r.o.NodeName {
			continue
		}
		if err := r.d.DeleteCheckpoint(ctx, rp.LocalID); err != nil && !errdefs.IsNotFound(err) {
			return fmt.Errorf("delete checkpoint %s: %w", rp.LocalID, err)
		}
	}
	// Only this node's entries go, from the latest object (other holders
	// remove theirs at the same time: a patch of a stale list would put
	// theirs back, and the node identity policy refuses a node that
	// changes another's entries).
	if slices.ContainsFunc(ck.Status.Replicas, func(rp fbv1.Replica) bool { return rp.Node == r.o.NodeName }) {
		if err := r.patchCheckpoint(ctx, ck, func(c *fbv1.Checkpoint) {
			c.Status.Replicas = slices.DeleteFunc(c.Status.Replicas, func(rp fbv1.Replica) bool { return rp.Node == r.o.NodeName })
		}); err != nil {
			return client.IgnoreNotFound(err)
		}
	}
	if len(ck.Status.Replicas) > 0 {
		return nil // other holders remove theirs
	}
	patch := client.MergeFrom(ck.DeepCopy())
	controllerutil.RemoveFinalizer(ck, fbv1.CheckpointFinalizer)
	return client.IgnoreNotFound(r.c.Patch(ctx, ck, patch))
}

func (r *checkpoints) writeStatus(ctx context.Context, before, ck *fbv1.Checkpoint) error {
	if equality.Semantic.DeepEqual(before.Status, ck.Status) {
		return nil
	}
	return client.IgnoreNotFound(r.c.Status().Patch(ctx, ck, client.MergeFrom(before)))
}
