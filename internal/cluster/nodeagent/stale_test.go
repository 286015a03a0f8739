package nodeagent

import (
	"context"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
	"github.com/forkbox/forkbox/internal/cluster/clustertest"
	"github.com/forkbox/forkbox/internal/cluster/kube"
)

// A closed sandbox the node agent's cache still shows, whose name a new
// sandbox (bound to no node yet) has taken on the API server: the close's
// writes (its status, dropping the finalizer) conflict, and the new
// sandbox is left as it is. The cluster suite failed on this in CI: the
// node identity policy refused the node's write to the new object.
func TestClosedSandboxWritesNotOnItsSuccessor(t *testing.T) {
	ctx := context.Background()
	build := func(objs ...client.Object) client.Client {
		return fake.NewClientBuilder().WithScheme(kube.NewScheme()).WithObjects(objs...).
			WithStatusSubresource(&fbv1.Sandbox{}).Build()
	}
	key := client.ObjectKey{Namespace: "ns", Name: "closed-crun"}
	old := &fbv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name, UID: "old", Finalizers: []string{fbv1.SandboxFinalizer}},
		Spec: fbv1.SandboxSpec{Runtime: fbv1.RuntimeCrun, Image: "img", State: fbv1.StateClosed, NodeName: "n1"}}
	successor := &fbv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name, UID: "new", Finalizers: []string{fbv1.SandboxFinalizer}},
		Spec: fbv1.SandboxSpec{Runtime: fbv1.RuntimeCrun, Image: "img", State: fbv1.StateRunning}}
	api := build(successor)
	// The successor has been written since (as the gateway and the placer
	// do): its resourceVersion is not the one the stale copy holds.
	var cur fbv1.Sandbox
	if err := api.Get(ctx, key, &cur); err != nil {
		t.Fatal(err)
	}
	cur.Labels = map[string]string{"touched": "1"}
	if err := api.Update(ctx, &cur); err != nil {
		t.Fatal(err)
	}
	r := &sandboxes{agent: &agent{o: Options{NodeName: "n1"}, c: clustertest.StaleCache{Client: api, Stale: build(old)}}}

	var sb fbv1.Sandbox
	if err := r.c.Get(ctx, key, &sb); err != nil {
		t.Fatal(err)
	}
	before := sb.DeepCopy()
	sb.Status.Phase = fbv1.PhaseClosed
	if err := r.writeStatusLocked(ctx, before, &sb); !apierrors.IsConflict(err) {
		t.Errorf("the close's status on the successor: %v, want a Conflict", err)
	}
	if err := r.c.Get(ctx, key, &sb); err != nil {
		t.Fatal(err)
	}
	if err := r.dropFinalizer(ctx, &sb); !apierrors.IsConflict(err) {
		t.Errorf("dropping the finalizer of the successor: %v, want a Conflict", err)
	}
	var got fbv1.Sandbox
	if err := api.Get(ctx, key, &got); err != nil {
		t.Fatal(err)
	}
	if got.UID != "new" || got.Status.Phase != "" || len(got.Finalizers) != 1 {
		t.Errorf("the successor after the stale writes: uid %s, phase %q, finalizers %v; want untouched", got.UID, got.Status.Phase, got.Finalizers)
	}
}
