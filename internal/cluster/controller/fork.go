package controller

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/recorder"

	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
	"github.com/forkbox/forkbox/internal/cluster/kube"
)

// forker turns a Fork into a Checkpoint of its source (unless the source
// is a checkpoint) and Count child Sandboxes started from it. The
// children are placed like any Sandbox: the checkpoint's node scores
// highest, so they fill it first and spill to the next best node. The
// Fork owns its Checkpoint and children.
type forker struct {
	c   client.Client
	api client.Reader // uncached: a child the cache does not show yet
	rec recorder.EventRecorder
	log *slog.Logger
}

func (f *forker) setup(mgr ctrl.Manager) error {
	// The forks of a source: a sandbox's, and a checkpoint's that the
	// fork does not own (a tagged one, which the gateway makes ready
	// before the Fork; this cache can see the Fork first).
	bySource := func(field string) handler.EventHandler {
		return handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
			var l fbv1.ForkList
			if err := f.c.List(ctx, &l, client.InNamespace(o.GetNamespace()), client.MatchingFields{field: o.GetName()}); err != nil {
				return nil
			}
			return requests(ptrs(l.Items))
		})
	}
	return ctrl.NewControllerManagedBy(mgr).Named("fork").
		For(&fbv1.Fork{}).
		Owns(&fbv1.Checkpoint{}).
		Owns(&fbv1.Sandbox{}).
		Watches(&fbv1.Sandbox{}, bySource(forkSandboxField)).
		Watches(&fbv1.Checkpoint{}, bySource(forkCheckpointField)).
		Complete(f)
}

func (f *forker) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var fk fbv1.Fork
	if err := f.c.Get(ctx, req.NamespacedName, &fk); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if !fk.DeletionTimestamp.IsZero() {
		return reconcile.Result{}, nil // owner references delete the rest
	}
	before := fk.DeepCopy()
	ck, err := f.checkpoint(ctx, &fk)
	if err != nil {
		return reconcile.Result{}, err
	}
	if ck != nil {
		if err := f.children(ctx, &fk, ck); err != nil {
			return reconcile.Result{}, err
		}
	}
	return reconcile.Result{}, f.writeStatus(ctx, before, &fk)
}

// checkpoint returns the Fork's checkpoint once it is ready, creating it
// from a sandbox source first; nil (with the Fork's status saying why)
// while there is none to fork from.
func (f *forker) checkpoint(ctx context.Context, fk *fbv1.Fork) (*fbv1.Checkpoint, error) {
	name := fk.Spec.Source.Checkpoint
	if name == "" {
		name = fk.Name
		created, err := f.capture(ctx, fk)
		if err != nil || !created {
			return nil, err
		}
	}
	fk.Status.Checkpoint = name
	var ck fbv1.Checkpoint
	if err := f.c.Get(ctx, types.NamespacedName{Namespace: fk.Namespace, Name: name}, &ck); err != nil {
		if errors.IsNotFound(err) {
			f.setPhase(fk, fbv1.ForkPending, "waiting for checkpoint "+name)
			return nil, nil
		}
		return nil, err
	}
	switch ck.Status.Phase {
	case fbv1.CheckpointReady:
		return &ck, nil
	case fbv1.CheckpointFailed:
		if len(fk.Status.Children) == 0 {
			f.setPhase(fk, fbv1.ForkFailed, "checkpoint "+name+" failed: "+ck.Status.Message)
		}
		return nil, nil
	}
	f.setPhase(fk, fbv1.ForkCheckpointing, "capturing checkpoint "+name)
	return nil, nil
}

// capture makes sure the Checkpoint of a sandbox source exists; it
// reports false (with the Fork's status saying why) while it cannot.
func (f *forker) capture(ctx context.Context, fk *fbv1.Fork) (bool, error) {
	var ck fbv1.Checkpoint
	err := f.c.Get(ctx, types.NamespacedName{Namespace: fk.Namespace, Name: fk.Name}, &ck)
	if err == nil {
		return true, nil
	}
	if !errors.IsNotFound(err) {
		return false, err
	}
	var src fbv1.Sandbox
	if err := f.c.Get(ctx, types.NamespacedName{Namespace: fk.Namespace, Name: fk.Spec.Source.Sandbox}, &src); err != nil {
		if errors.IsNotFound(err) {
			f.setPhase(fk, fbv1.ForkFailed, "source sandbox "+fk.Spec.Source.Sandbox+" does not exist")
			return false, nil
		}
		return false, err
	}
	if src.Spec.NodeName == "" || (src.Status.Phase != fbv1.PhaseRunning && src.Status.Phase != fbv1.PhasePaused) {
		f.setPhase(fk, fbv1.ForkPending, fmt.Sprintf("waiting for source sandbox %s to run (phase %q)", src.Name, src.Status.Phase))
		return false, nil
	}
	ck = fbv1.Checkpoint{
		ObjectMeta: metav1.ObjectMeta{Namespace: fk.Namespace, Name: fk.Name, Labels: map[string]string{fbv1.ForkLabel: fk.Name}},
		Spec:       fbv1.CheckpointSpec{Sandbox: src.Name, Memory: fk.Spec.Memory, NodeName: src.Spec.NodeName, Parent: src.Spec.SourceCheckpoint()},
	}
	if err := controllerutil.SetControllerReference(fk, &ck, f.c.Scheme()); err != nil {
		return false, err
	}
	if err := f.c.Create(ctx, &ck); err != nil && !errors.IsAlreadyExists(err) {
		return false, fmt.Errorf("create checkpoint of fork %s: %w", fk.Name, err)
	}
	f.rec.Eventf(fk, &ck, "Normal", "Checkpointing", "Fork", "checkpoint %s of sandbox %s on node %s", ck.Name, src.Name, src.Spec.NodeName)
	return true, nil
}

// createFailed starts the message of a child the API refused to create
// (it is tried again, unlike a child that existed and was deleted).
const createFailed = "create: "

// childDeleted is the message of a child that existed and was deleted.
const childDeleted = "deleted"

// childName is the name of a fork's i-th child.
func childName(fk *fbv1.Fork, i int) string { return fk.Name + "-" + strconv.Itoa(i) }

// liveChild reads child name of fk from the API server: nil when it is
// gone (or no longer fk's).
func (f *forker) liveChild(ctx context.Context, fk *fbv1.Fork, name string) (*fbv1.Sandbox, error) {
	var sb fbv1.Sandbox
	if err := f.api.Get(ctx, client.ObjectKey{Namespace: fk.Namespace, Name: name}, &sb); err != nil {
		return nil, client.IgnoreNotFound(err)
	}
	if !metav1.IsControlledBy(&sb, fk) {
		return nil, nil
	}
	return &sb, nil
}

// children creates the missing children and records how each one is.
func (f *forker) children(ctx context.Context, fk *fbv1.Fork, ck *fbv1.Checkpoint) error {
	var l fbv1.SandboxList
	if err := f.c.List(ctx, &l, client.InNamespace(fk.Namespace), client.MatchingLabels{fbv1.ForkLabel: fk.Name}); err != nil {
		return err
	}
	have := map[string]*fbv1.Sandbox{}
	for i := range l.Items {
		if metav1.IsControlledBy(&l.Items[i], fk) {
			have[l.Items[i].Name] = &l.Items[i]
		}
	}
	made := map[string]bool{} // children made before: a deleted one is not made again
	gone := map[string]bool{} // children recorded deleted
	for _, c := range fk.Status.Children {
		made[c.Name] = !strings.HasPrefix(c.Message, createFailed)
		gone[c.Name] = c.Phase == fbv1.PhaseTerminating && c.Message == childDeleted
	}
	// Read once, and only when a child is to be made.
	inherited := sync.OnceValues(func() ([]fbv1.Credential, error) { return f.inherited(ctx, fk, ck) })
	var out []fbv1.ForkChild
	ready, settled := int32(0), 0
	for i := range int(fk.Spec.Count) {
		name := childName(fk, i)
		sb := have[name]
		if sb == nil && made[name] && !gone[name] {
			// The cache can be a write behind the child's create (the
			// fork's status, written after it, can come first): a
			// child is deleted only when the API server says so.
			live, err := f.liveChild(ctx, fk, name)
			if err != nil {
				return err
			}
			sb = live
		}
		if sb == nil && made[name] {
			out = append(out, fbv1.ForkChild{Name: name, Phase: fbv1.PhaseTerminating, Message: childDeleted})
			settled++
			continue
		}
		if sb == nil {
			creds, err := inherited()
			if err != nil {
				return err
			}
			sb = f.child(fk, ck, name, creds)
			if err := controllerutil.SetControllerReference(fk, sb, f.c.Scheme()); err != nil {
				return err
			}
			if err := f.c.Create(ctx, sb); err != nil && !errors.IsAlreadyExists(err) {
				// One child failing does not fail the others.
				out = append(out, fbv1.ForkChild{Name: name, Phase: fbv1.PhaseFailed, Message: kube.Truncate(createFailed+err.Error(), 1024)})
				settled++
				continue
			}
		}
		c := fbv1.ForkChild{Name: name, Node: sb.Spec.NodeName, Phase: sb.Status.Phase, Message: kube.Truncate(sb.Status.Message, 1024)}
		switch c.Phase {
		case fbv1.PhaseRunning:
			ready++
			settled++
		case fbv1.PhaseFailed, fbv1.PhaseLost, fbv1.PhaseClosed:
			settled++
		}
		out = append(out, c)
	}
	fk.Status.Children, fk.Status.Ready = out, ready
	if settled == len(out) {
		f.setPhase(fk, fbv1.ForkComplete, fmt.Sprintf("%d of %d children running", ready, len(out)))
	} else {
		f.setPhase(fk, fbv1.ForkForking, fmt.Sprintf("%d of %d children running", ready, len(out)))
	}
	return nil
}

// inherited are the credentials children get from their source: the
// checkpoint's sandbox's, but for per-fork ones (each child's must be in
// the overrides), each overridden by the Fork's of the same name. The
// source is read from the API server: a credential set just before the
// fork may not be in the cache yet, and a child made without it would
// never get it. Only reconciles that make children read it.
func (f *forker) inherited(ctx context.Context, fk *fbv1.Fork, ck *fbv1.Checkpoint) ([]fbv1.Credential, error) {
	var out []fbv1.Credential
	given := map[string]bool{}
	for _, c := range fk.Spec.Overrides.Credentials {
		given[c.Name] = true
	}
	if ck.Spec.Sandbox != "" {
		var src fbv1.Sandbox
		err := f.api.Get(ctx, types.NamespacedName{Namespace: fk.Namespace, Name: ck.Spec.Sandbox}, &src)
		if err != nil && !errors.IsNotFound(err) {
			return nil, err
		}
		if src.CreationTimestamp.After(ck.CreationTimestamp.Time) {
			// A later sandbox of that name (names are free again once
			// closed): not the one the checkpoint captured, and its
			// credentials are not the children's to have.
			src.Spec.Credentials = nil
		}
		for _, c := range src.Spec.Credentials {
			if !c.PerFork && !given[c.Name] {
				out = append(out, c)
			}
		}
	}
	return append(out, fk.Spec.Overrides.Credentials...), nil
}

// child is the Sandbox of one child: the checkpoint plus the Fork's
// overrides and the credentials inherited; its node inherits the rest
// from the checkpoint.
func (f *forker) child(fk *fbv1.Fork, ck *fbv1.Checkpoint, name string, creds []fbv1.Credential) *fbv1.Sandbox {
	o := fk.Spec.Overrides
	return &fbv1.Sandbox{
		ObjectMeta: metav1.ObjectMeta{Namespace: fk.Namespace, Name: name, Labels: map[string]string{fbv1.ForkLabel: fk.Name}},
		Spec: fbv1.SandboxSpec{
			Source:      &fbv1.SandboxSource{Checkpoint: ck.Name},
			Resources:   *o.Resources.DeepCopy(),
			Env:         slices.Clone(o.Env),
			WorkingDir:  o.WorkingDir,
			Credentials: slices.Clone(creds),
			Egress:      o.Egress.DeepCopy(),
			State:       fbv1.StateRunning,
		},
	}
}

func (f *forker) setPhase(fk *fbv1.Fork, ph fbv1.ForkPhase, msg string) {
	fk.Status.Phase, fk.Status.Message = ph, kube.Truncate(msg, 4096)
	kube.SetCondition(&fk.Status.Conditions, fbv1.ConditionReady, ph == fbv1.ForkComplete && fk.Status.Ready == fk.Spec.Count,
		string(ph), fk.Status.Message, fk.Generation)
}

func (f *forker) writeStatus(ctx context.Context, before, fk *fbv1.Fork) error {
	if equalStatus(before.Status, fk.Status) {
		return nil
	}
	if before.Status.Phase != fk.Status.Phase {
		f.log.InfoContext(ctx, "fork", slog.String("fork", fk.Namespace+"/"+fk.Name), slog.String("phase", string(fk.Status.Phase)),
			slog.String("message", fk.Status.Message))
	}
	return f.c.Status().Patch(ctx, fk, client.MergeFrom(before))
}
