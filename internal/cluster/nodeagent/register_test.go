package nodeagent

import (
	"context"
	"log/slog"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
	"github.com/forkbox/forkbox/internal/cluster/kube"
)

// A beat renews the node's Lease even when the API server does not answer
// the node's registration within the beat (a loaded control plane): the
// renewal goes first, so the lease does not lapse for a slow write that
// does not keep the node alive. Here reading the ForkboxNode never
// answers until the beat's bound (2 s: the renewal has all of it).
func TestBeatRenewsBeforeRegistering(t *testing.T) {
	const ns, name = "forkbox", "n1"
	old := metav1.NewMicroTime(time.Now().Add(-time.Hour).Truncate(time.Second))
	node := &fbv1.ForkboxNode{ObjectMeta: metav1.ObjectMeta{Name: name, UID: "u1"}}
	lease := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To(name), LeaseDurationSeconds: ptr.To(int32(1)), RenewTime: &old},
	}
	c := fake.NewClientBuilder().WithScheme(kube.NewScheme()).WithObjects(node, lease).
		WithInterceptorFuncs(interceptor.Funcs{
			Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
				if _, ok := obj.(*fbv1.ForkboxNode); ok {
					<-ctx.Done() // the slow API server under test
					return ctx.Err()
				}
				return c.Get(ctx, key, obj, opts...)
			},
		}).Build()
	a := &agent{o: Options{NodeName: name, Namespace: ns, LeaseDuration: 3 * time.Second}, log: slog.New(slog.DiscardHandler), c: c, api: c, registered: true}

	if err := a.beat(context.Background()); err == nil {
		t.Fatal("beat: no error, though the node's registration could not be read")
	}
	var got coordinationv1.Lease
	if err := c.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, &got); err != nil {
		t.Fatal(err)
	}
	if got.Spec.RenewTime == nil || !got.Spec.RenewTime.After(old.Time) {
		t.Errorf("lease renewed at %v, want after %v: the slow registration kept the renewal from being sent", got.Spec.RenewTime, old)
	}
}

// The renewal a beat makes before it registers the node never creates the
// Lease: one that is gone went with its ForkboxNode (its owner), and a
// lease made then would name the deleted node and be collected again. It
// is made after the registration, owned by the node that exists.
func TestRenewBeforeRegisteringMakesNoLease(t *testing.T) {
	const ns, name = "forkbox", "n1"
	c := fake.NewClientBuilder().WithScheme(kube.NewScheme()).Build()
	a := &agent{o: Options{NodeName: name, Namespace: ns, LeaseDuration: 6 * time.Second}, log: slog.New(slog.DiscardHandler), c: c, api: c}
	ctx := context.Background()
	key := types.NamespacedName{Namespace: ns, Name: name}
	if err := a.renewExisting(ctx); !apierrors.IsNotFound(err) {
		t.Fatalf("renewExisting without a lease: %v, want NotFound", err)
	}
	var l coordinationv1.Lease
	if err := c.Get(ctx, key, &l); !apierrors.IsNotFound(err) {
		t.Fatalf("a lease was made before the registration: %v %+v", err, l.OwnerReferences)
	}
	node := &fbv1.ForkboxNode{ObjectMeta: metav1.ObjectMeta{Name: name, UID: "u-new"}}
	if err := a.renew(ctx, node); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(ctx, key, &l); err != nil {
		t.Fatal(err)
	}
	if len(l.OwnerReferences) != 1 || l.OwnerReferences[0].UID != "u-new" {
		t.Errorf("lease owners %+v, want the registered node u-new", l.OwnerReferences)
	}
}
