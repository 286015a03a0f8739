package controller

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
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

// environments builds each Environment into a Checkpoint, out of objects
// the rest of the cluster already handles: a builder Sandbox (placed
// like any other; its node agent runs the setup steps in it and reports
// SetupComplete), then a Checkpoint of it on its node. When that is
// Ready it becomes status.checkpoint, the builder is closed (its object
// stays, as one host keeps a closed builder's record, until the
// retention), and the checkpoint of the build before goes. The builder
// is named build-<build> (BuilderName), as one host names it. A build is named after the spec's hash
// (and, for a rebuild of the same spec after maxAge, the time the
// replaced one was built), so a reconcile that runs again finds the
// objects it made; a failed build is not tried again until the spec
// changes, maxAge passes or a retry is asked for (RetryAnnotation). A
// builder that fails to start fails the build too, with its node's
// reason. Until a new build is ready the old checkpoint keeps serving.
// Once the Environment is gone its builders and checkpoints go too (as
// the garbage collector would, which a cluster may not run). A spec with
// a setupHash has its setup run by a client instead (through the
// gateway): its builder has no build-hash annotation, so no node agent
// runs steps in it, and its outcome is the client's word on the builder
// (SetupResultAnnotation), within ClientSetupTimeout.
type environments struct {
	c   client.Client
	rec recorder.EventRecorder
	log *slog.Logger
}

func (r *environments) setup(mgr ctrl.Manager) error {
	byLabel := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		name := o.GetLabels()[fbv1.EnvironmentLabel]
		if name == "" {
			return nil
		}
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: name}}}
	})
	return ctrl.NewControllerManagedBy(mgr).Named("environments").
		For(&fbv1.Environment{}).
		Watches(&fbv1.Sandbox{}, byLabel).
		Watches(&fbv1.Checkpoint{}, byLabel).
		Complete(r)
}

// Reasons of an Environment's conditions.
const (
	ReasonBuilding      = "Building"
	ReasonBuilt         = "Built"
	ReasonSetupFailed   = "SetupFailed"
	ReasonCaptureFailed = "CaptureFailed"
	ReasonNotBuilt      = "NotBuilt"
	// ReasonBuilderFailed: the builder sandbox failed or its node was
	// lost. A builder whose node refused to create it names the class of
	// the refusal instead: CreateFailed<Class> (its Ready reason).
	ReasonBuilderFailed = "BuilderFailed"
)

func (r *environments) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var e fbv1.Environment
	if err := r.c.Get(ctx, req.NamespacedName, &e); err != nil {
		if errors.IsNotFound(err) {
			return reconcile.Result{}, r.collect(ctx, req.NamespacedName, "")
		}
		return reconcile.Result{}, err
	}
	if !e.DeletionTimestamp.IsZero() {
		return reconcile.Result{}, nil // owner references delete the rest
	}
	if err := r.collect(ctx, req.NamespacedName, e.UID); err != nil {
		return reconcile.Result{}, err
	}
	before := e.DeepCopy()
	res, err := r.reconcile(ctx, &e)
	if err != nil {
		return reconcile.Result{}, err
	}
	if !equalStatus(before.Status, e.Status) {
		if err := r.c.Status().Patch(ctx, &e, client.MergeFrom(before)); err != nil {
			return reconcile.Result{}, err
		}
	}
	return res, nil
}

func (r *environments) reconcile(ctx context.Context, e *fbv1.Environment) (reconcile.Result, error) {
	hash := e.Spec.Hash()
	build := fbv1.BuildName(e, hash)
	var res reconcile.Result
	if e.Status.Checkpoint != "" && e.Status.Hash == hash && e.Status.Checkpoint == build {
		// Built and current; look again when it gets too old.
		e.Status.Build = build
		kube.SetCondition(&e.Status.Conditions, fbv1.ConditionReady, true, ReasonBuilt, "checkpoint "+e.Status.Checkpoint+" serves", e.Generation)
		if e.Spec.MaxAge != nil && e.Status.BuiltAt != nil {
			res.RequeueAfter = time.Until(e.Status.BuiltAt.Add(e.Spec.MaxAge.Duration)) + 100*time.Millisecond
		}
		return res, r.cleanup(ctx, e, build, e.Status.Checkpoint)
	}
	if e.Status.Build == build {
		if c := meta.FindStatusCondition(e.Status.Conditions, fbv1.ConditionBuilt); c != nil && c.Status == metav1.ConditionFalse &&
			c.Reason != ReasonBuilding {
			return res, r.cleanup(ctx, e, "", e.Status.Checkpoint) // this build failed: not again until the spec changes or it ages
		}
	}
	if e.Status.Checkpoint == "" {
		kube.SetCondition(&e.Status.Conditions, fbv1.ConditionReady, false, ReasonNotBuilt, "no build has finished yet", e.Generation)
	}
	if e.Status.Build != build {
		e.Status.Build = build
		r.rec.Eventf(e, nil, "Normal", ReasonBuilding, "Build", "building %s (spec hash %s)", build, hash)
		r.log.InfoContext(ctx, "environment build", slog.String("environment", e.Namespace+"/"+e.Name), slog.String("build", build))
	}
	building := func(msg string) {
		kube.SetCondition(&e.Status.Conditions, fbv1.ConditionBuilt, false, ReasonBuilding, msg, e.Generation)
	}
	builder, err := r.builder(ctx, e, build, hash)
	if err != nil || builder == nil {
		return res, err
	}
	setup := meta.FindStatusCondition(builder.Status.Conditions, fbv1.ConditionSetupComplete)
	if e.Spec.SetupHash != "" {
		var wait time.Duration
		if setup, wait = clientSetup(builder); wait > 0 {
			res.RequeueAfter = wait
		}
	}
	switch {
	case setup == nil && (builder.Status.Phase == fbv1.PhaseFailed || builder.Status.Phase == fbv1.PhaseLost || builder.Spec.State == fbv1.StateClosed):
		reason := ReasonBuilderFailed
		if c := meta.FindStatusCondition(builder.Status.Conditions, fbv1.ConditionReady); c != nil && strings.HasPrefix(c.Reason, "CreateFailed") {
			reason = c.Reason
		}
		phase := strings.ToLower(string(builder.Status.Phase))
		if builder.Spec.State == fbv1.StateClosed {
			phase = "closed"
		}
		r.fail(e, reason, fmt.Sprintf("build %s: builder sandbox %s on node %s: %s", build, phase,
			builder.Spec.NodeName, builder.Status.Message))
		return res, nil
	case setup == nil:
		building(fmt.Sprintf("builder sandbox %s: %s %s", builder.Name, builder.Status.Phase, builder.Status.Message))
		return res, nil
	case setup.Status == metav1.ConditionUnknown: // its agent is running the steps
		building("builder sandbox " + builder.Name + " on node " + builder.Spec.NodeName + ": " + setup.Message)
		return res, nil
	case setup.Status != metav1.ConditionTrue:
		r.fail(e, ReasonSetupFailed, "build "+build+": "+setup.Message)
		return res, nil
	}
	ck, err := r.checkpoint(ctx, e, build, builder)
	if err != nil || ck == nil {
		return res, err
	}
	switch ck.Status.Phase {
	case fbv1.CheckpointReady:
	case fbv1.CheckpointFailed:
		r.fail(e, ReasonCaptureFailed, "build "+build+": checkpoint failed: "+ck.Status.Message)
		return res, nil
	default:
		building("capturing checkpoint " + build + " on node " + builder.Spec.NodeName)
		return res, nil
	}
	now := metav1.Now()
	e.Status.Checkpoint, e.Status.Hash, e.Status.BuiltAt = build, hash, &now
	kube.SetCondition(&e.Status.Conditions, fbv1.ConditionBuilt, true, ReasonBuilt, "built "+build+" on node "+builder.Spec.NodeName, e.Generation)
	kube.SetCondition(&e.Status.Conditions, fbv1.ConditionReady, true, ReasonBuilt, "checkpoint "+build+" serves", e.Generation)
	r.rec.Eventf(e, ck, "Normal", ReasonBuilt, "Build", "built checkpoint %s on node %s", build, builder.Spec.NodeName)
	r.log.InfoContext(ctx, "environment built", slog.String("environment", e.Namespace+"/"+e.Name), slog.String("checkpoint", build))
	// The status is written before the old objects go; the next
	// reconcile (this write triggers it) removes them.
	return res, nil
}

func (r *environments) fail(e *fbv1.Environment, reason, msg string) {
	if c := meta.FindStatusCondition(e.Status.Conditions, fbv1.ConditionBuilt); c == nil || c.Reason != reason {
		r.rec.Eventf(e, nil, "Warning", reason, "Build", "%s", kube.Truncate(msg, 1024))
	}
	kube.SetCondition(&e.Status.Conditions, fbv1.ConditionBuilt, false, reason, kube.Truncate(msg, 4096), e.Generation)
}

// builder returns the builder Sandbox of build, creating it first.
func (r *environments) builder(ctx context.Context, e *fbv1.Environment, build, hash string) (*fbv1.Sandbox, error) {
	var sb fbv1.Sandbox
	name := fbv1.BuilderName(build)
	err := r.c.Get(ctx, types.NamespacedName{Namespace: e.Namespace, Name: name}, &sb)
	if err == nil && !metav1.IsControlledBy(&sb, e) {
		// The builder of an Environment of this name that was deleted
		// (same spec, same build name): not ours to use; collect deletes
		// it, and its going brings us back.
		kube.SetCondition(&e.Status.Conditions, fbv1.ConditionBuilt, false, ReasonBuilding,
			"waiting for sandbox "+name+" of an earlier environment of this name to go", e.Generation)
		return nil, nil
	}
	if err == nil || !errors.IsNotFound(err) {
		return &sb, err
	}
	sb = fbv1.Sandbox{
		ObjectMeta: metav1.ObjectMeta{Namespace: e.Namespace, Name: name,
			Labels:      map[string]string{fbv1.EnvironmentLabel: e.Name},
			Annotations: map[string]string{fbv1.BuildHashAnnotation: hash}},
		Spec: fbv1.SandboxSpec{Image: e.Spec.Image, Runtime: e.Spec.Runtime, Resources: *e.Spec.Resources.DeepCopy(),
			Env: append([]fbv1.EnvVar(nil), e.Spec.Env...), WorkingDir: e.Spec.WorkingDir, State: fbv1.StateRunning},
	}
	if e.Spec.SetupHash != "" {
		delete(sb.Annotations, fbv1.BuildHashAnnotation) // its client runs the setup, not its node agent
	}
	if err := controllerutil.SetControllerReference(e, &sb, r.c.Scheme()); err != nil {
		return nil, err
	}
	if err := r.c.Create(ctx, &sb); err != nil && !errors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("create builder of environment %s: %w", e.Name, err)
	}
	kube.SetCondition(&e.Status.Conditions, fbv1.ConditionBuilt, false, ReasonBuilding, "builder sandbox "+name+" created", e.Generation)
	return nil, nil // its status comes with the next reconcile
}

// checkpoint returns the Checkpoint of build, creating it first (nil).
func (r *environments) checkpoint(ctx context.Context, e *fbv1.Environment, build string, builder *fbv1.Sandbox) (*fbv1.Checkpoint, error) {
	var ck fbv1.Checkpoint
	err := r.c.Get(ctx, types.NamespacedName{Namespace: e.Namespace, Name: build}, &ck)
	if err == nil && !metav1.IsControlledBy(&ck, e) {
		kube.SetCondition(&e.Status.Conditions, fbv1.ConditionBuilt, false, ReasonBuilding,
			"waiting for checkpoint "+build+" of an earlier environment of this name to go", e.Generation)
		return nil, nil // as for the builder
	}
	if err == nil || !errors.IsNotFound(err) {
		return &ck, err
	}
	ck = fbv1.Checkpoint{
		ObjectMeta: metav1.ObjectMeta{Namespace: e.Namespace, Name: build, Labels: map[string]string{fbv1.EnvironmentLabel: e.Name}},
		Spec:       fbv1.CheckpointSpec{Sandbox: builder.Name, NodeName: builder.Spec.NodeName, Parent: builder.Spec.SourceCheckpoint()},
	}
	if err := controllerutil.SetControllerReference(e, &ck, r.c.Scheme()); err != nil {
		return nil, err
	}
	if err := r.c.Create(ctx, &ck); err != nil && !errors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("create checkpoint of environment %s: %w", e.Name, err)
	}
	kube.SetCondition(&e.Status.Conditions, fbv1.ConditionBuilt, false, ReasonBuilding, "capturing checkpoint "+build, e.Generation)
	return nil, nil
}

// cleanup closes the environment's builder Sandboxes other than that of
// build (all once it is built: keep is its checkpoint), and deletes its
// Checkpoints other than keep and build's. A closed builder stays (as
// one host lists its closed builders) until the retention deletes it; one
// that was never placed ran nowhere and is deleted.
func (r *environments) cleanup(ctx context.Context, e *fbv1.Environment, build, keep string) error {
	mine := client.MatchingLabels{fbv1.EnvironmentLabel: e.Name}
	var sl fbv1.SandboxList
	if err := r.c.List(ctx, &sl, client.InNamespace(e.Namespace), mine); err != nil {
		return err
	}
	for i := range sl.Items {
		sb := &sl.Items[i]
		if !metav1.IsControlledBy(sb, e) || !sb.DeletionTimestamp.IsZero() || sb.Spec.State == fbv1.StateClosed ||
			(sb.Name == fbv1.BuilderName(build) && build != keep) {
			continue
		}
		if sb.Spec.NodeName == "" {
			if err := r.c.Delete(ctx, sb); client.IgnoreNotFound(err) != nil {
				return err
			}
			continue
		}
		patch := client.MergeFrom(sb.DeepCopy())
		sb.Spec.State = fbv1.StateClosed
		if err := r.c.Patch(ctx, sb, patch); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("close builder %s: %w", sb.Name, err)
		}
	}
	var cl fbv1.CheckpointList
	if err := r.c.List(ctx, &cl, client.InNamespace(e.Namespace), mine); err != nil {
		return err
	}
	for i := range cl.Items {
		ck := &cl.Items[i]
		if !metav1.IsControlledBy(ck, e) || !ck.DeletionTimestamp.IsZero() || ck.Name == keep || ck.Name == build {
			continue
		}
		r.log.InfoContext(ctx, "environment checkpoint replaced", slog.String("environment", e.Namespace+"/"+e.Name), slog.String("checkpoint", ck.Name))
		if err := r.c.Delete(ctx, ck); client.IgnoreNotFound(err) != nil {
			return err
		}
	}
	return nil
}

// collect deletes what a deleted Environment called key left: the
// builder Sandboxes and Checkpoints controlled by an Environment of that
// name other than the one of UID keep ("" when none exists now), found
// by its label and their controller reference. An Environment deleted
// and made again (same name, new UID) does not take over the objects of
// the first, which may be going already.
func (r *environments) collect(ctx context.Context, key types.NamespacedName, keep types.UID) error {
	mine := []client.ListOption{client.InNamespace(key.Namespace), client.MatchingLabels{fbv1.EnvironmentLabel: key.Name}}
	var sl fbv1.SandboxList
	if err := r.c.List(ctx, &sl, mine...); err != nil {
		return err
	}
	var cl fbv1.CheckpointList
	if err := r.c.List(ctx, &cl, mine...); err != nil {
		return err
	}
	var objs []client.Object
	for i := range sl.Items {
		objs = append(objs, &sl.Items[i])
	}
	for i := range cl.Items {
		objs = append(objs, &cl.Items[i])
	}
	for _, o := range objs {
		ref := metav1.GetControllerOf(o)
		if ref == nil || ref.Kind != "Environment" || ref.Name != key.Name || ref.UID == keep || !o.GetDeletionTimestamp().IsZero() {
			continue
		}
		if keep == "" {
			// One made again since the cache said it was gone keeps its own.
			var now fbv1.Environment
			if err := r.c.Get(ctx, key, &now); err == nil && ref.UID == now.UID {
				continue
			} else if err != nil && !errors.IsNotFound(err) {
				return err
			}
		}
		r.log.InfoContext(ctx, "collecting what a deleted environment left", slog.String("environment", key.String()), slog.String("object", o.GetName()))
		if err := r.c.Delete(ctx, o); client.IgnoreNotFound(err) != nil {
			return err
		}
	}
	return nil
}

// ClientSetupTimeout bounds how long a client may hold the builder of a
// client-run setup (as the daemon bounds a build lease).
const ClientSetupTimeout = 2 * time.Hour

// clientSetup is the outcome of a client-run setup as a SetupComplete
// condition would say it, from the builder's SetupResultAnnotation: nil
// while the builder is not running yet, Unknown while its client holds
// it (and wait is when that times out), False once the client said it
// failed or the time is up.
func clientSetup(sb *fbv1.Sandbox) (c *metav1.Condition, wait time.Duration) {
	v, said := sb.Annotations[fbv1.SetupResultAnnotation]
	switch {
	case said && v == "ok":
		return &metav1.Condition{Status: metav1.ConditionTrue, Message: "the client's setup is done"}, 0
	case said:
		return &metav1.Condition{Status: metav1.ConditionFalse, Message: kube.Truncate(strings.TrimPrefix(v, "failed: "), 2048)}, 0
	case sb.Status.Phase != fbv1.PhaseRunning:
		return nil, 0
	}
	left := ClientSetupTimeout - time.Since(sb.CreationTimestamp.Time)
	if left <= 0 {
		return &metav1.Condition{Status: metav1.ConditionFalse, Message: fmt.Sprintf("the client's setup did not end within %s", ClientSetupTimeout)}, 0
	}
	msg := "waiting for a client to take the builder"
	if sb.Annotations[fbv1.LeaseAnnotation] != "" {
		msg = "its client runs the setup"
	}
	return &metav1.Condition{Status: metav1.ConditionUnknown, Message: msg}, left + 100*time.Millisecond
}
