package controller

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/recorder"

	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
	"github.com/forkbox/forkbox/internal/cluster/kube"
)

// Reasons of a node's Ready condition.
const (
	ReasonLeaseRenewed = "LeaseRenewed" // set by the node agent
	ReasonLeaseExpired = "LeaseExpired" // set by the controller
	ReasonNodeLost     = "NodeLost"     // on the Sandboxes of such a node
)

// nodeWatch marks a node NotReady once its heartbeat Lease has not been
// renewed for its duration, and reports the node's sandboxes Lost. They
// are not recreated elsewhere: their state lives on that host, and the
// node reconciles them when it comes back.
type nodeWatch struct {
	c         client.Client
	api       client.Reader // uncached: a lapse is confirmed there
	rec       recorder.EventRecorder
	log       *slog.Logger
	namespace string
}

func (w *nodeWatch) setup(mgr ctrl.Manager) error {
	byLease := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		if o.GetNamespace() != w.namespace {
			return nil
		}
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: o.GetName()}}}
	})
	return ctrl.NewControllerManagedBy(mgr).Named("nodes").
		For(&fbv1.ForkboxNode{}).
		Watches(&coordinationv1.Lease{}, byLease).
		Complete(w)
}

// expiry returns when the lease lapses (zero: it never was renewed).
func expiry(l *coordinationv1.Lease) time.Time {
	if l.Spec.RenewTime == nil || l.Spec.LeaseDurationSeconds == nil {
		return time.Time{}
	}
	return l.Spec.RenewTime.Add(time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second)
}

func (w *nodeWatch) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var n fbv1.ForkboxNode
	if err := w.c.Get(ctx, req.NamespacedName, &n); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	leaseName := n.Status.LeaseName
	if leaseName == "" {
		leaseName = n.Name
	}
	until, err := w.leaseUntil(ctx, w.c, leaseName)
	if err == nil && !time.Now().Before(until) {
		// The cache can be a write behind a renewal (a node back after a
		// lapse renews, then reports Ready): a lapse is confirmed on the
		// API server before the node's sandboxes are marked lost.
		until, err = w.leaseUntil(ctx, w.api, leaseName)
	}
	if err != nil {
		return reconcile.Result{}, err
	}
	if left := time.Until(until); left > 0 {
		// Look again when it would lapse; a renewal requeues us earlier.
		return reconcile.Result{RequeueAfter: left + 100*time.Millisecond}, nil
	}
	msg := "the node's Lease " + w.namespace + "/" + leaseName + " was never renewed"
	if !until.IsZero() {
		msg = fmt.Sprintf("the node's Lease %s/%s lapsed at %s", w.namespace, leaseName, until.UTC().Format(time.RFC3339))
	}
	if c := meta.FindStatusCondition(n.Status.Conditions, fbv1.ConditionReady); c == nil || c.Reason != ReasonLeaseExpired {
		// Locked: the patch replaces the whole list of conditions, and
		// the agent's newer ones are not written over (a conflict tries
		// again from a fresh read).
		patch := client.MergeFromWithOptions(n.DeepCopy(), client.MergeFromWithOptimisticLock{})
		kube.SetCondition(&n.Status.Conditions, fbv1.ConditionReady, false, ReasonLeaseExpired, msg, n.Generation)
		if err := w.c.Status().Patch(ctx, &n, patch); err != nil {
			return reconcile.Result{}, err
		}
		w.log.WarnContext(ctx, "node not ready", slog.String("node", n.Name), slog.String("reason", msg))
		w.rec.Eventf(&n, nil, "Warning", "NodeNotReady", "Heartbeat", "%s", msg)
	}
	return reconcile.Result{}, w.reportLost(ctx, &n, msg)
}

// leaseUntil returns when lease name lapses as r shows it (zero: never
// renewed, or no such lease).
func (w *nodeWatch) leaseUntil(ctx context.Context, r client.Reader, name string) (time.Time, error) {
	var l coordinationv1.Lease
	if err := r.Get(ctx, types.NamespacedName{Namespace: w.namespace, Name: name}, &l); err != nil {
		return time.Time{}, client.IgnoreNotFound(err)
	}
	return expiry(&l), nil
}

// reportLost marks the node's sandboxes Lost (once each).
func (w *nodeWatch) reportLost(ctx context.Context, n *fbv1.ForkboxNode, why string) error {
	var l fbv1.SandboxList
	if err := w.c.List(ctx, &l, client.MatchingFields{fbv1.NodeNameField: n.Name}); err != nil {
		return err
	}
	for i := range l.Items {
		sb := &l.Items[i]
		if sb.Status.Phase == fbv1.PhaseLost || sb.Status.Phase == fbv1.PhaseFailed || sb.Closed() || !sb.DeletionTimestamp.IsZero() {
			// A closed one stays closed: nothing of it runs to be lost
			// (its ledger is on the node, unreachable while it is down).
			continue
		}
		patch := client.MergeFrom(sb.DeepCopy())
		sb.Status.Phase = fbv1.PhaseLost
		sb.Status.Message = kube.Truncate("node "+n.Name+" is not ready: "+why, 4096)
		kube.SetCondition(&sb.Status.Conditions, fbv1.ConditionReady, false, ReasonNodeLost, sb.Status.Message, sb.Generation)
		if err := w.c.Status().Patch(ctx, sb, patch); err != nil {
			return client.IgnoreNotFound(err)
		}
		w.rec.Eventf(sb, n, "Warning", ReasonNodeLost, "Heartbeat", "node %s is not ready; the sandbox is not recreated elsewhere", n.Name)
	}
	return nil
}
