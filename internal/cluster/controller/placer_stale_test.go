package controller

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
	"github.com/forkbox/forkbox/internal/cluster/clustertest"
	"github.com/forkbox/forkbox/internal/cluster/kube"
)

// A cordon (or a node gone) that the placer's cache does not show yet
// still holds for a sandbox created after it: the placer checks the node
// it chose on the API server before it binds. The cluster suite failed on
// this in CI: every node cordoned, then a create, and the sandbox was
// placed. An uncordon the cache does not show yet is seen too: a first
// refusal is made again from the API server.
func TestPlacerHonoursCordonBehindCache(t *testing.T) {
	ctx := context.Background()
	node := func(name string, cordoned bool) *fbv1.ForkboxNode {
		n := &fbv1.ForkboxNode{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: fbv1.ForkboxNodeSpec{Unschedulable: cordoned},
			Status: fbv1.ForkboxNodeStatus{Runtimes: []fbv1.RuntimeInfo{{Name: fbv1.RuntimeCrun}}, Allocatable: fbv1.Allocatable{Slots: 4}}}
		kube.SetCondition(&n.Status.Conditions, fbv1.ConditionReady, true, "Ready", "", 0)
		return n
	}
	sandbox := &fbv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "box"},
		Spec: fbv1.SandboxSpec{Runtime: fbv1.RuntimeCrun, Image: "img", State: fbv1.StateRunning}}
	build := func(objs ...client.Object) client.Client {
		return fake.NewClientBuilder().WithScheme(kube.NewScheme()).WithObjects(objs...).
			WithStatusSubresource(&fbv1.Sandbox{}).Build()
	}
	open := []client.Object{node("a", false), node("b", false)}
	for _, tc := range []struct {
		name       string
		cache, api []client.Object // the nodes as each shows them
		want       string          // the node bound, "" for none
	}{
		// "a" wins ties on its name.
		{"a cordoned", open, []client.Object{node("a", true), node("b", false)}, "b"},
		{"a gone", open, []client.Object{node("b", false)}, "b"},
		{"every node cordoned", open, []client.Object{node("a", true), node("b", true)}, ""},
		{"a uncordoned", []client.Object{node("a", true), node("b", true)}, []client.Object{node("a", false), node("b", true)}, "a"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stale := build(append(clone(tc.cache), sandbox.DeepCopy())...)
			api := build(append(clone(tc.api), sandbox.DeepCopy())...)
			p := &placer{c: clustertest.StaleCache{Client: api, Stale: stale}, api: api, rec: events.NewFakeRecorder(10),
				log: slog.New(slog.NewTextHandler(io.Discard, nil)), retry: time.Minute, assumed: map[string]string{}}
			if _, err := p.Reconcile(ctx, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(sandbox)}); err != nil {
				t.Fatal(err)
			}
			var got fbv1.Sandbox
			if err := api.Get(ctx, client.ObjectKeyFromObject(sandbox), &got); err != nil {
				t.Fatal(err)
			}
			if got.Spec.NodeName != tc.want {
				t.Fatalf("bound to %q, want %q", got.Spec.NodeName, tc.want)
			}
			if tc.want == "" {
				c := meta.FindStatusCondition(got.Status.Conditions, fbv1.ConditionScheduled)
				if c == nil || c.Status != metav1.ConditionFalse || c.Reason != ReasonUnschedulable {
					t.Fatalf("Scheduled condition %+v, want False %s", c, ReasonUnschedulable)
				}
			}
		})
	}
}

func clone(objs []client.Object) []client.Object {
	out := make([]client.Object, len(objs))
	for i, o := range objs {
		out[i] = o.DeepCopyObject().(client.Object)
	}
	return out
}
