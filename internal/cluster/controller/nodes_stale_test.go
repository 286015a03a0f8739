package controller

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
	"github.com/forkbox/forkbox/internal/cluster/clustertest"
	"github.com/forkbox/forkbox/internal/cluster/kube"
)

// A node whose Lease the watch's cache shows lapsed, but which has renewed
// it on the API server (a node back after a lapse), is not marked not
// ready and its sandboxes are not marked lost. One whose Lease has lapsed
// there too is.
func TestNodeLapseBehindCache(t *testing.T) {
	ctx := context.Background()
	lease := func(renewed time.Time) client.Object {
		return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "fb", Name: "n"},
			Spec: coordinationv1.LeaseSpec{RenewTime: &metav1.MicroTime{Time: renewed}, LeaseDurationSeconds: ptr.To[int32](10)}}
	}
	node := func() client.Object {
		n := &fbv1.ForkboxNode{ObjectMeta: metav1.ObjectMeta{Name: "n"}}
		kube.SetCondition(&n.Status.Conditions, fbv1.ConditionReady, true, "Ready", "", 0)
		return n
	}
	sandbox := func() client.Object {
		return &fbv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "box"},
			Spec: fbv1.SandboxSpec{NodeName: "n", State: fbv1.StateRunning}, Status: fbv1.SandboxStatus{Phase: fbv1.PhaseRunning}}
	}
	build := func(objs ...client.Object) client.Client {
		return fake.NewClientBuilder().WithScheme(kube.NewScheme()).WithObjects(objs...).
			WithStatusSubresource(&fbv1.ForkboxNode{}, &fbv1.Sandbox{}).
			WithIndex(&fbv1.Sandbox{}, fbv1.NodeNameField, func(o client.Object) []string { return []string{o.(*fbv1.Sandbox).Spec.NodeName} }).
			Build()
	}
	lapsed := time.Now().Add(-time.Minute)
	for _, tc := range []struct {
		name    string
		renewed time.Time // on the API server
		lost    bool
	}{
		{"renewed", time.Now(), false},
		{"lapsed", lapsed, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			api := build(lease(tc.renewed), node(), sandbox())
			w := &nodeWatch{c: clustertest.StaleCache{Client: api, Stale: build(lease(lapsed), node(), sandbox())}, api: api,
				rec: events.NewFakeRecorder(10), log: slog.New(slog.NewTextHandler(io.Discard, nil)), namespace: "fb"}
			res, err := w.Reconcile(ctx, reconcile.Request{NamespacedName: client.ObjectKey{Name: "n"}})
			if err != nil {
				t.Fatal(err)
			}
			var n fbv1.ForkboxNode
			var sb fbv1.Sandbox
			if err := api.Get(ctx, client.ObjectKey{Name: "n"}, &n); err != nil {
				t.Fatal(err)
			}
			if err := api.Get(ctx, client.ObjectKey{Namespace: "ns", Name: "box"}, &sb); err != nil {
				t.Fatal(err)
			}
			ready := meta.IsStatusConditionTrue(n.Status.Conditions, fbv1.ConditionReady)
			if ready == tc.lost || (sb.Status.Phase == fbv1.PhaseLost) != tc.lost {
				t.Fatalf("node Ready %v, sandbox %s; want lost %v", ready, sb.Status.Phase, tc.lost)
			}
			if !tc.lost && res.RequeueAfter <= 0 {
				t.Errorf("a renewed lease: requeue after %v, want when it would lapse", res.RequeueAfter)
			}
		})
	}
}
