package gateway

import (
	"context"
	"io"
	"log/slog"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/forkbox/forkbox/errdefs"
	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
	"github.com/forkbox/forkbox/internal/cluster/clustertest"
	"github.com/forkbox/forkbox/internal/cluster/kube"
)

// A fork's room is counted again on the API server before it is refused:
// an uncordon the gateway's cache does not show yet leaves room, and a
// cluster with no room is still refused.
func TestRoomForAfterCacheLag(t *testing.T) {
	ctx := context.Background()
	node := func(cordoned bool) client.Object {
		n := &fbv1.ForkboxNode{ObjectMeta: metav1.ObjectMeta{Name: "n"}, Spec: fbv1.ForkboxNodeSpec{Unschedulable: cordoned},
			Status: fbv1.ForkboxNodeStatus{Allocatable: fbv1.Allocatable{Slots: 2}}}
		kube.SetCondition(&n.Status.Conditions, fbv1.ConditionReady, true, "Ready", "", 0)
		return n
	}
	build := func(o client.Object) client.Client {
		return fake.NewClientBuilder().WithScheme(kube.NewScheme()).WithObjects(o).Build()
	}
	gw := func(cache, api client.Object) *Gateway {
		a := build(api)
		return &Gateway{o: Options{Namespace: "ns"}, c: clustertest.StaleCache{Client: a, Stale: build(cache)}, api: a,
			log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	}
	if err := gw(node(true), node(false)).roomFor(ctx, 2, false); err != nil {
		t.Errorf("uncordoned behind the cache: got %v, want room for 2", err)
	}
	if err := gw(node(false), node(false)).roomFor(ctx, 3, false); !errdefs.IsResourceExhausted(err) {
		t.Errorf("3 children on 2 slots: got %v, want ResourceExhausted", err)
	}
	if err := gw(node(false), node(true)).roomFor(ctx, 1, false); err != nil {
		t.Errorf("a cordon behind the cache: got %v; the placer refuses the children, not the count", err)
	}
}
