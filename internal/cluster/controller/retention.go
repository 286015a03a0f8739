package controller

import (
	"context"
	"log/slog"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
)

// DefaultRetention is how long a closed Sandbox's object stays by default.
const DefaultRetention = time.Hour

// retention deletes the objects of closed Sandboxes once they have been
// closed for longer than the retention. Until then a closed sandbox is
// listed (ListSandboxes with all), read (GetSandbox: state closed) and
// its ledger reached on its node (Events), as on one host, where the
// record stays. A sandbox asked to close before it was placed has run
// nowhere and has no record to keep: it is deleted at once. Deleting a
// closed object frees nothing on its node (its node agent closed the
// local sandbox and dropped its finalizer) and keeps the node's ledger.
type retention struct {
	c     client.Client
	log   *slog.Logger
	after time.Duration
}

func (r *retention) setup(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).Named("retention").For(&fbv1.Sandbox{}).Complete(r)
}

func (r *retention) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var sb fbv1.Sandbox
	if err := r.c.Get(ctx, req.NamespacedName, &sb); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if !sb.DeletionTimestamp.IsZero() {
		return reconcile.Result{}, nil
	}
	switch {
	case sb.Spec.State == fbv1.StateClosed && sb.Spec.NodeName == "":
		return reconcile.Result{}, r.delete(ctx, &sb, "closed before it was placed")
	case !sb.Closed():
		return reconcile.Result{}, nil
	}
	since := sb.CreationTimestamp.Time
	if sb.Status.ClosedAt != nil {
		since = sb.Status.ClosedAt.Time
	}
	if left := time.Until(since.Add(r.after)); left > 0 {
		return reconcile.Result{RequeueAfter: left + 100*time.Millisecond}, nil
	}
	return reconcile.Result{}, r.delete(ctx, &sb, "closed for longer than the retention ("+r.after.String()+")")
}

// delete deletes sb if it is still the object that was read (a sandbox
// of its name made since is not touched).
func (r *retention) delete(ctx context.Context, sb *fbv1.Sandbox, why string) error {
	uid, rv := sb.UID, sb.ResourceVersion
	err := r.c.Delete(ctx, sb, client.Preconditions{UID: &uid, ResourceVersion: &rv})
	if err := client.IgnoreNotFound(err); err != nil {
		return err
	}
	r.log.InfoContext(ctx, "closed sandbox deleted", slog.String("sandbox", sb.Namespace+"/"+sb.Name), slog.String("reason", why))
	return nil
}
