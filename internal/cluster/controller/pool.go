package controller

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"slices"
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
)

// pools keeps each built Environment's warm pool: spec.poolSize
// Sandboxes started from its checkpoint (status.checkpoint), labelled
// PoolLabel and controlled by the Environment. They are ordinary
// Sandboxes: the placer puts them where the checkpoint is and they hold
// a node's slot like any other. A handover (the gateway's
// EnvironmentSandbox) takes one out of the pool by removing its label
// and controller reference in one optimistic-lock write; the Sandbox is
// then its caller's, and the pool is refilled. Members of an older
// checkpoint (a rebuild), beyond the size, of a lost node, or of an
// Environment that is gone are deleted, each under a precondition on its
// resource version, so a member claimed meanwhile is never deleted. A
// member that failed is replaced after the retry interval (not at once:
// a node that refuses them all would be asked again and again).
//
// It reads the Environment and its members from the API server, not the
// cache: a member made by the last reconcile is always counted, so the
// pool never overshoots.
type pools struct {
	c     client.Client
	api   client.Reader
	rec   recorder.EventRecorder
	log   *slog.Logger
	retry time.Duration
}

func (r *pools) setup(mgr ctrl.Manager) error {
	byLabel := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		name := o.GetLabels()[fbv1.PoolLabel]
		if name == "" {
			return nil
		}
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: name}}}
	})
	return ctrl.NewControllerManagedBy(mgr).Named("pools").
		For(&fbv1.Environment{}).
		Watches(&fbv1.Sandbox{}, byLabel). // an update maps the old object too: a claimed member (label gone) refills
		Complete(r)
}

// Reasons of a warm pool's Events on its Environment.
const (
	ReasonPoolMemberFailed = "PoolMemberFailed"
)

func (r *pools) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var e fbv1.Environment
	err := r.api.Get(ctx, req.NamespacedName, &e)
	if err != nil && !errors.IsNotFound(err) {
		return reconcile.Result{}, err
	}
	var l fbv1.SandboxList
	if err := r.api.List(ctx, &l, client.InNamespace(req.Namespace), client.MatchingLabels{fbv1.PoolLabel: req.Name}); err != nil {
		return reconcile.Result{}, err
	}
	members := l.Items
	slices.SortFunc(members, func(a, b fbv1.Sandbox) int {
		return cmp.Or(a.CreationTimestamp.Compare(b.CreationTimestamp.Time), cmp.Compare(a.Name, b.Name))
	})
	if errors.IsNotFound(err) || !e.DeletionTimestamp.IsZero() {
		// Gone (or going): so is its pool, as the garbage collector
		// would do (a cluster may not run one).
		for i := range members {
			if !pooledBy(&members[i], req.Name) {
				continue
			}
			if err := r.remove(ctx, &members[i], req.String(), "its environment is gone"); err != nil {
				return reconcile.Result{}, err
			}
		}
		return reconcile.Result{}, nil
	}
	res, err := r.keep(ctx, &e, members)
	if err != nil {
		return res, err
	}
	before := e.DeepCopy()
	e.Status.PoolReady = int32(ready(&e, members))
	if before.Status.PoolReady != e.Status.PoolReady {
		if err := r.c.Status().Patch(ctx, &e, client.MergeFrom(before)); client.IgnoreNotFound(err) != nil {
			return res, err
		}
	}
	return res, nil
}

// keep deletes the members of e's pool that do not serve and starts new
// ones until spec.poolSize are there.
func (r *pools) keep(ctx context.Context, e *fbv1.Environment, members []fbv1.Sandbox) (reconcile.Result, error) {
	var res reconcile.Result
	key := e.Namespace + "/" + e.Name
	size, ck := int(e.Spec.PoolSize), e.Status.Checkpoint
	if ck == "" {
		size = 0 // nothing to start them from yet
	}
	kept, held := 0, 0
	for i := range members {
		m := &members[i]
		if !m.DeletionTimestamp.IsZero() || !pooledBy(m, e.Name) {
			continue // not a pool's member, only labelled so
		}
		var why string
		switch {
		case !metav1.IsControlledBy(m, e):
			why = "it belongs to an earlier environment of this name"
		case m.Spec.Source == nil || m.Spec.Source.Checkpoint != ck:
			why = "the environment was rebuilt: it serves checkpoint " + ck
		case m.Status.Phase == fbv1.PhaseLost:
			why = "its node " + m.Spec.NodeName + " is lost"
		case m.Closed() || m.Spec.State != "" && m.Spec.State != fbv1.StateRunning:
			// Waiting members are asked to run; one asked to stop (by a
			// caller or kubectl) or closed would leave the pool short: it
			// is replaced. (One its node hibernated when idle is still
			// asked to run, and wakes on its first exec.)
			why = fmt.Sprintf("it is %s, asked %s: not waiting to run", m.Status.Phase, m.Spec.State)
		case m.Status.Phase == fbv1.PhaseFailed:
			wait := r.retry - time.Since(failedAt(m))
			if wait <= 0 {
				why = "it failed: " + m.Status.Message
				break
			}
			if res.RequeueAfter == 0 || wait < res.RequeueAfter {
				res.RequeueAfter = wait + 100*time.Millisecond
			}
			held++ // replaced after the retry interval
			continue
		case kept >= size:
			why = fmt.Sprintf("the pool holds %d", size)
		default:
			kept++
			continue
		}
		if m.Status.Phase == fbv1.PhaseFailed {
			r.rec.Eventf(e, m, "Warning", ReasonPoolMemberFailed, "Pool", "warm pool sandbox %s failed on node %s: %.512s", m.Name, m.Spec.NodeName, m.Status.Message)
		}
		if err := r.remove(ctx, m, key, why); err != nil {
			return res, err
		}
	}
	for n := kept + held; n < size; n++ {
		if err := r.start(ctx, e, ck); err != nil {
			return res, err
		}
	}
	return res, nil
}

// start creates one member of e's pool from checkpoint ck.
func (r *pools) start(ctx context.Context, e *fbv1.Environment, ck string) error {
	base := e.Name
	if len(base) > 50 {
		base = base[:50]
	}
	sb := &fbv1.Sandbox{
		ObjectMeta: metav1.ObjectMeta{Namespace: e.Namespace, GenerateName: "pool-" + base + "-",
			Labels: map[string]string{fbv1.PoolLabel: e.Name}},
		Spec: fbv1.SandboxSpec{Source: &fbv1.SandboxSource{Checkpoint: ck}, State: fbv1.StateRunning},
	}
	if err := controllerutil.SetControllerReference(e, sb, r.c.Scheme()); err != nil {
		return err
	}
	if err := r.c.Create(ctx, sb); err != nil {
		return fmt.Errorf("create warm pool sandbox of environment %s: %w", e.Name, err)
	}
	r.log.InfoContext(ctx, "warm pool sandbox started", slog.String("environment", e.Namespace+"/"+e.Name),
		slog.String("sandbox", sb.Name), slog.String("checkpoint", ck))
	return nil
}

// remove deletes a member of a pool unless it changed since it was read
// (a handover took it: it is no longer the pool's).
func (r *pools) remove(ctx context.Context, m *fbv1.Sandbox, env, why string) error {
	if !m.DeletionTimestamp.IsZero() {
		return nil
	}
	rv := m.ResourceVersion
	err := r.c.Delete(ctx, m, client.Preconditions{UID: &m.UID, ResourceVersion: &rv})
	if errors.IsConflict(err) || errors.IsNotFound(err) {
		return nil // changed meanwhile: its change brings the next reconcile
	}
	if err != nil {
		return fmt.Errorf("delete warm pool sandbox %s: %w", m.Name, err)
	}
	r.log.InfoContext(ctx, "warm pool sandbox deleted", slog.String("environment", env), slog.String("sandbox", m.Name), slog.String("why", why))
	return nil
}

// pooledBy reports whether sb is controlled by an Environment called
// name (this one, or an earlier one of that name).
func pooledBy(sb *fbv1.Sandbox, name string) bool {
	ref := metav1.GetControllerOf(sb)
	return ref != nil && ref.Kind == "Environment" && ref.Name == name
}

// ready counts the members of e's pool that can be handed over now.
func ready(e *fbv1.Environment, members []fbv1.Sandbox) int {
	n := 0
	for i := range members {
		if PoolMemberReady(e, &members[i]) {
			n++
		}
	}
	return n
}

// PoolMemberReady reports whether sb is a member of e's warm pool that
// can be handed over: controlled by e, of its current checkpoint,
// running on its node, not being deleted.
func PoolMemberReady(e *fbv1.Environment, sb *fbv1.Sandbox) bool {
	return sb.Labels[fbv1.PoolLabel] == e.Name && metav1.IsControlledBy(sb, e) && sb.DeletionTimestamp.IsZero() &&
		e.Status.Checkpoint != "" && sb.Spec.Source != nil && sb.Spec.Source.Checkpoint == e.Status.Checkpoint &&
		sb.Status.Phase == fbv1.PhaseRunning && sb.Status.LocalID != ""
}

// failedAt is when sb failed, as its Ready condition says (else when it
// was made).
func failedAt(sb *fbv1.Sandbox) time.Time {
	if c := meta.FindStatusCondition(sb.Status.Conditions, fbv1.ConditionReady); c != nil && c.Status == metav1.ConditionFalse {
		return c.LastTransitionTime.Time
	}
	return sb.CreationTimestamp.Time
}
