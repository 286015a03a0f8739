package nodeagent

import (
	"context"
	"log/slog"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
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
// answers until the beat's bound.
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
	a := &agent{o: Options{NodeName: name, Namespace: ns, LeaseDuration: 300 * time.Millisecond}, log: slog.New(slog.DiscardHandler), c: c, api: c, node: node}

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
