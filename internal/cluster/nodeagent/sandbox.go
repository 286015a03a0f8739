package nodeagent

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/forkbox/forkbox/errdefs"
	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
	"github.com/forkbox/forkbox/internal/cluster/kube"
	"github.com/forkbox/forkbox/internal/daemon"
	"github.com/forkbox/forkbox/internal/store"
)

// sandboxes makes the local sandboxes match the Sandboxes bound to this
// node: create (from an image or a checkpoint), pause, hibernate, wake,
// close; and reports each one's status.
type sandboxes struct{ *agent }

func (r *sandboxes) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var sb fbv1.Sandbox
	if err := r.c.Get(ctx, req.NamespacedName, &sb); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if sb.Spec.NodeName != r.o.NodeName {
		return reconcile.Result{}, nil // the cache selects ours; be sure anyway
	}
	name := kube.LocalSandboxName(&sb)
	if !sb.DeletionTimestamp.IsZero() {
		return reconcile.Result{}, r.close(ctx, &sb, name)
	}
	if sb.Spec.State == fbv1.StateClosed || sb.Closed() {
		return reconcile.Result{}, r.retire(ctx, &sb, name)
	}
	if !controllerutil.ContainsFinalizer(&sb, fbv1.SandboxFinalizer) {
		// Recorded before acted on: the local sandbox never outlives
		// the object unnoticed.
		patch := lockedFrom(sb.DeepCopy())
		controllerutil.AddFinalizer(&sb, fbv1.SandboxFinalizer)
		if err := r.c.Patch(ctx, &sb, patch); err != nil {
			return reconcile.Result{}, err
		}
	}
	before := sb.DeepCopy()
	local, err := r.d.Get(ctx, name)
	switch {
	case errdefs.IsNotFound(err):
		if sb.Status.LocalID != "" {
			// It existed here and is gone from the ledger: never recreate.
			r.setFailed(&sb, "LocalSandboxGone", "the node's ledger no longer has sandbox "+sb.Status.LocalID)
			return reconcile.Result{}, r.writeStatus(ctx, before, &sb)
		}
		if finalFailure(&sb) {
			// Not retried (see failed) until the spec changes: each try
			// writes Creating then Failed, a loop of writes otherwise.
			return reconcile.Result{}, nil
		}
		local, err = r.create(ctx, &sb, name, before)
		if err != nil {
			return r.failed(ctx, before, &sb, "CreateFailed", err)
		}
	case err != nil:
		return reconcile.Result{}, err
	}
	if local.State == store.StateClosed {
		// Closed here (its timeout, or a caller of this node's API): the
		// object records it as it would a close asked for.
		return reconcile.Result{}, r.retire(ctx, &sb, name)
	}
	if err := r.syncCredentials(ctx, &sb, local); err != nil {
		r.rec.Eventf(&sb, nil, corev1.EventTypeWarning, "CredentialsFailed", "Credentials", "%s", kube.Truncate(err.Error(), 1024))
	}
	if err := r.drive(ctx, &sb, local); err != nil {
		r.rec.Eventf(&sb, nil, corev1.EventTypeWarning, "StateChangeFailed", "Drive", "%s", kube.Truncate(err.Error(), 1024))
		sb.Status.Message = kube.Truncate(err.Error(), 4096)
	}
	if local, err = r.d.Get(ctx, local.ID); err != nil {
		return reconcile.Result{}, err
	}
	r.report(ctx, &sb, local)
	if err := r.reportResumed(ctx, &sb, local); err != nil {
		return reconcile.Result{}, err
	}
	if err := r.setup(ctx, before, &sb, local); err != nil {
		return reconcile.Result{}, err
	}
	return reconcile.Result{RequeueAfter: r.o.Resync}, r.writeStatus(ctx, before, &sb)
}

// create starts the local sandbox of sb, recording Creating first.
func (r *sandboxes) create(ctx context.Context, sb *fbv1.Sandbox, name string, before *fbv1.Sandbox) (*store.Sandbox, error) {
	sb.Status.Phase, sb.Status.Message = fbv1.PhaseCreating, ""
	kube.SetCondition(&sb.Status.Conditions, fbv1.ConditionScheduled, true, "Bound", "bound to node "+r.o.NodeName, sb.Generation)
	if err := r.writeStatus(ctx, before, sb); err != nil {
		return nil, err
	}
	*before = *sb.DeepCopy()
	creds, err := r.credentials(ctx, sb)
	if err != nil {
		return nil, err
	}
	var local *store.Sandbox
	if src := sb.Spec.Source; src != nil && src.Resume {
		// The session's credentials come back with it.
		if local, err = r.resume(ctx, sb, name); err != nil {
			return nil, err
		}
	} else if src != nil {
		ckID, err := r.localCheckpoint(ctx, sb)
		if err != nil {
			return nil, err
		}
		// The object names all of its credentials (its parent's are
		// merged in by whoever made it): exactly those, not the
		// checkpoint's sandbox's, which may be on another node.
		var with []daemon.CredentialValue
		for _, c := range creds {
			with = append(with, daemon.CredentialValue{Spec: c.spec, Value: c.value})
		}
		local, err = r.d.RestoreSnapshotWith(ctx, ckID, overrides(&sb.Spec, name), with)
		if err != nil {
			return nil, err
		}
	} else {
		if local, err = r.d.Create(ctx, createOptions(&sb.Spec, name)); err != nil {
			return nil, err
		}
	}
	if sb.Spec.Source == nil {
		for _, c := range creds {
			if _, err := r.d.SetCredential(ctx, local.ID, c.spec, c.value); err != nil {
				return local, fmt.Errorf("credential %s: %w", c.spec.Name, err)
			}
		}
	}
	r.noteApplied(sb, creds)
	r.log.InfoContext(ctx, "sandbox created", slog.String("sandbox", sb.Namespace+"/"+sb.Name), slog.String("local", local.ID))
	r.rec.Eventf(sb, nil, corev1.EventTypeNormal, "Created", "Create", "sandbox %s created on node %s", local.ID, r.o.NodeName)
	return local, nil
}

// localCheckpoint is this node's ID of the checkpoint sb starts from.
func (r *sandboxes) localCheckpoint(ctx context.Context, sb *fbv1.Sandbox) (string, error) {
	name := sb.Spec.Source.Checkpoint
	if env := sb.Spec.Source.Environment; env != "" {
		var e fbv1.Environment
		if err := r.api.Get(ctx, types.NamespacedName{Namespace: sb.Namespace, Name: env}, &e); err != nil {
			return "", fmt.Errorf("environment %s: %v: %w", env, err, errdefs.ErrFailedPrecondition)
		}
		name = e.Status.Checkpoint
	}
	var ck fbv1.Checkpoint
	if err := r.api.Get(ctx, types.NamespacedName{Namespace: sb.Namespace, Name: name}, &ck); err != nil {
		return "", fmt.Errorf("checkpoint %q: %v: %w", name, err, errdefs.ErrFailedPrecondition)
	}
	if id, err := r.heldCopy(ctx, &ck); err != nil || id != "" {
		return id, err
	}
	if ck.Status.Phase != fbv1.CheckpointReady {
		return "", fmt.Errorf("checkpoint %s is %s: %w", name, ck.Status.Phase, errdefs.ErrUnavailable)
	}
	return r.pull(ctx, &ck)
}

// drive moves the local sandbox toward the state asked for.
func (r *sandboxes) drive(ctx context.Context, sb *fbv1.Sandbox, local *store.Sandbox) error {
	want := sb.Spec.State
	if want == "" {
		want = fbv1.StateRunning
	}
	var err error
	switch {
	case want == fbv1.StateRunning && local.State == store.StatePaused:
		_, err = r.d.Unpause(ctx, local.ID)
	case want == fbv1.StateRunning && local.State == store.StateHibernated:
		_, err = r.d.Wake(ctx, local.ID)
	case want == fbv1.StatePaused && local.State == store.StateRunning:
		_, err = r.d.Pause(ctx, local.ID)
	case want == fbv1.StateHibernated && (local.State == store.StateRunning || local.State == store.StatePaused):
		_, err = r.d.Hibernate(ctx, local.ID)
	default:
		return nil
	}
	if err == nil {
		r.rec.Eventf(sb, nil, corev1.EventTypeNormal, string(want), "Drive", "sandbox %s is now %s", local.ID, want)
	}
	return err
}

// report copies the local sandbox's facts into sb's status.
func (r *sandboxes) report(ctx context.Context, sb *fbv1.Sandbox, local *store.Sandbox) {
	ph := phaseOf(local.State)
	sb.Status.Phase, sb.Status.IP, sb.Status.LocalID = ph, local.IP, local.ID
	var n fbv1.ForkboxNode
	if err := r.c.Get(ctx, types.NamespacedName{Name: r.o.NodeName}, &n); err == nil {
		sb.Status.Endpoint = n.Spec.Endpoint
	}
	sb.Status.ObservedGeneration = sb.Generation
	if ph == fbv1.PhaseFailed {
		msg := "the sandbox is " + string(local.State) + " on its node"
		if local.Error != "" {
			msg += ": " + local.Error
		}
		sb.Status.Message = kube.Truncate(msg, 4096)
	} else if ph == phaseWanted(sb.Spec.State) {
		sb.Status.Message = ""
	}
	kube.SetCondition(&sb.Status.Conditions, fbv1.ConditionScheduled, true, "Bound", "bound to node "+r.o.NodeName, sb.Generation)
	kube.SetCondition(&sb.Status.Conditions, fbv1.ConditionReady, ph == fbv1.PhaseRunning, string(ph), sb.Status.Message, sb.Generation)
}

func phaseWanted(s fbv1.DesiredState) fbv1.SandboxPhase {
	switch s {
	case fbv1.StatePaused:
		return fbv1.PhasePaused
	case fbv1.StateHibernated:
		return fbv1.PhaseHibernated
	}
	return fbv1.PhaseRunning
}

// failed records a failure to create. Errors of the caller's making
// (bad input, a missing image or checkpoint) are final: the Sandbox is
// Failed and not retried. Others are retried with backoff.
func (r *sandboxes) failed(ctx context.Context, before, sb *fbv1.Sandbox, reason string, err error) (reconcile.Result, error) {
	r.rec.Eventf(sb, nil, corev1.EventTypeWarning, reason, "Create", "%s", kube.Truncate(err.Error(), 1024))
	final := errdefs.IsInvalidArgument(err) || errdefs.IsNotFound(err) || errdefs.IsFailedPrecondition(err) || errdefs.IsAlreadyExists(err)
	if !final {
		sb.Status.Message = kube.Truncate(err.Error(), 4096)
		if werr := r.writeStatus(ctx, before, sb); werr != nil {
			return reconcile.Result{}, werr
		}
		return reconcile.Result{}, err
	}
	// The reason carries the error's class (CreateFailedNotFound, ...):
	// the gateway answers a failed create with it.
	r.setFailed(sb, reason+errdefs.ClassName(err), err.Error())
	return reconcile.Result{}, r.writeStatus(ctx, before, sb)
}

// finalFailure reports whether sb's create failed for good at its
// current generation.
func finalFailure(sb *fbv1.Sandbox) bool {
	c := meta.FindStatusCondition(sb.Status.Conditions, fbv1.ConditionReady)
	return sb.Status.Phase == fbv1.PhaseFailed && c != nil && c.ObservedGeneration == sb.Generation &&
		strings.HasPrefix(c.Reason, "CreateFailed")
}

func (r *sandboxes) setFailed(sb *fbv1.Sandbox, reason, msg string) {
	sb.Status.Phase, sb.Status.Message = fbv1.PhaseFailed, kube.Truncate(msg, 4096)
	kube.SetCondition(&sb.Status.Conditions, fbv1.ConditionReady, false, reason, sb.Status.Message, sb.Generation)
}

func (r *sandboxes) writeStatus(ctx context.Context, before, sb *fbv1.Sandbox) error {
	return r.patchStatus(ctx, before, sb, client.MergeFrom(before))
}

// writeStatusLocked is writeStatus for an object that may be gone from
// the API server with its name taken by a new one (a closed or deleted
// sandbox): written only to the object before was read as.
func (r *sandboxes) writeStatusLocked(ctx context.Context, before, sb *fbv1.Sandbox) error {
	return r.patchStatus(ctx, before, sb, lockedFrom(before))
}

// patchStatus writes sb's status with patch, when it differs from before's.
func (r *sandboxes) patchStatus(ctx context.Context, before, sb *fbv1.Sandbox, patch client.Patch) error {
	if equality.Semantic.DeepEqual(before.Status, sb.Status) {
		return nil
	}
	return r.c.Status().Patch(ctx, sb, patch)
}

// lockedFrom is a merge patch from base that the API server applies only
// to the object base was read as (its resourceVersion; a Conflict
// otherwise, before any admission), for the writes that act on what the
// object was: its finalizer, a close's status. The cache can still show a
// sandbox that was closed and deleted while a new one took its name, bound
// to no node yet: a plain merge patch by name wrote to the new one (the
// node identity policy refused it, in the cluster suite in CI). Status
// reports stay plain merge patches: a Conflict there would lose a result
// the next reconcile does not make again (a builder's setup).
func lockedFrom(base client.Object) client.Patch {
	return client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})
}

// dropFinalizer removes the finalizer from sb (the object read as sb).
func (r *sandboxes) dropFinalizer(ctx context.Context, sb *fbv1.Sandbox) error {
	patch := lockedFrom(sb.DeepCopy())
	controllerutil.RemoveFinalizer(sb, fbv1.SandboxFinalizer)
	return client.IgnoreNotFound(r.c.Patch(ctx, sb, patch))
}

// retire closes the local sandbox of an object asked to be Closed (or
// found closed here) and records it: phase Closed, when, and the
// finalizer dropped, since nothing of it is left on the node but its
// ledger's record (which the object's deletion leaves too). The object
// stays for the controller's retention; reads of a closed sandbox are
// answered from it and from this node's ledger.
func (r *sandboxes) retire(ctx context.Context, sb *fbv1.Sandbox, name string) error {
	before := sb.DeepCopy()
	local, err := r.d.Get(ctx, name)
	switch {
	case err == nil && local.State != store.StateClosed:
		if err := r.d.Delete(ctx, local.ID); err != nil && !errdefs.IsNotFound(err) {
			return fmt.Errorf("close sandbox %s: %w", local.ID, err)
		}
		r.log.InfoContext(ctx, "sandbox closed", slog.String("sandbox", sb.Namespace+"/"+sb.Name), slog.String("local", local.ID))
		r.rec.Eventf(sb, nil, corev1.EventTypeNormal, "Closed", "Close", "sandbox %s closed on node %s", local.ID, r.o.NodeName)
	case err != nil && !errdefs.IsNotFound(err):
		return err
	}
	if !sb.Closed() {
		now := metav1.Now()
		sb.Status.Phase, sb.Status.Message, sb.Status.ClosedAt = fbv1.PhaseClosed, "", &now
		if err == nil {
			if sb.Status.LocalID == "" {
				sb.Status.LocalID = local.ID
			}
			if local, err := r.d.Get(ctx, local.ID); err == nil {
				sb.Status.Message = kube.Truncate(local.Error, 4096) // why, when it did not close on request (as one host shows it)
			}
		}
		sb.Status.ObservedGeneration = sb.Generation
		kube.SetCondition(&sb.Status.Conditions, fbv1.ConditionReady, false, string(fbv1.PhaseClosed), "closed on node "+r.o.NodeName, sb.Generation)
		if err := r.writeStatusLocked(ctx, before, sb); err != nil {
			return err
		}
	}
	r.setups.Delete(sb.UID)
	if !controllerutil.ContainsFinalizer(sb, fbv1.SandboxFinalizer) {
		return nil
	}
	return r.dropFinalizer(ctx, sb)
}

// close closes the local sandbox of a deleted object, then lets the
// object go.
func (r *sandboxes) close(ctx context.Context, sb *fbv1.Sandbox, name string) error {
	if !controllerutil.ContainsFinalizer(sb, fbv1.SandboxFinalizer) {
		return nil
	}
	local, err := r.d.Get(ctx, name)
	switch {
	case err == nil && local.State != store.StateClosed:
		if err := r.d.Delete(ctx, local.ID); err != nil && !errdefs.IsNotFound(err) {
			return fmt.Errorf("close sandbox %s: %w", local.ID, err)
		}
		r.log.InfoContext(ctx, "sandbox closed", slog.String("sandbox", sb.Namespace+"/"+sb.Name), slog.String("local", local.ID))
	case err != nil && !errdefs.IsNotFound(err):
		return err
	}
	r.setups.Delete(sb.UID)
	r.credsApplied.Delete(sb.UID)
	return r.dropFinalizer(ctx, sb)
}
