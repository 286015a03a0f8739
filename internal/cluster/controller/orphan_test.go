package controller

import (
	"context"
	"fmt"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
	"github.com/forkbox/forkbox/internal/cluster/clustertest"
)

// gone waits until o is deleted for good (its finalizers removed).
func gone(t *testing.T, o client.Object, why string) {
	t.Helper()
	clustertest.Eventually(t, 30*time.Second, o.GetName()+" gone "+why, func() (bool, string) {
		err := plane.Client.Get(context.Background(), client.ObjectKeyFromObject(o), o)
		return errors.IsNotFound(err), fmt.Sprintf("%v; finalizers %v", err, o.GetFinalizers())
	})
}

// deleteNode removes a node from the cluster as a host that goes away
// does: its ForkboxNode, and its agent's Lease (or, with lease false,
// only the object: an administrator's delete under a live agent).
func deleteNode(t *testing.T, name string, lease bool) {
	t.Helper()
	ctx := context.Background()
	if lease {
		if err := plane.Client.Delete(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: clustertest.Namespace, Name: name}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := plane.Client.Delete(ctx, &fbv1.ForkboxNode{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil && !errors.IsNotFound(err) {
		t.Fatal(err)
	}
}

// placedAfter makes an unplaced sandbox and waits until the placer has
// placed it: the placer, one worker on a queue in order, has then handled
// every sandbox event before it.
func placedAfter(t *testing.T, ns, name string) {
	t.Helper()
	sb := sandbox(ns, name)
	create(t, sb)
	placedOn(t, sb)
}

// A sandbox deleted while its node stays keeps the node agent's finalizer
// (the agent removes it with the local sandbox), also once the node's
// object is deleted while its agent's Lease is current (the agent makes
// it again on its next heartbeat). When the node has left the cluster,
// its Lease gone too, nothing else changes that sandbox, and the node's
// going releases it.
func TestDeletedSandboxReleasedWhenItsNodeGoes(t *testing.T) {
	plane.Need(t)
	startController(t)
	ns := namespace(t)
	node(t, "or-sb", 4, long)
	node(t, "or-sb-other", 4, long)
	sb := sandbox(ns, "bound", func(sb *fbv1.Sandbox) {
		sb.Spec.NodeName = "or-sb"
		sb.Finalizers = []string{fbv1.SandboxFinalizer}
	})
	create(t, sb)
	if err := plane.Client.Delete(context.Background(), sb); err != nil {
		t.Fatal(err)
	}
	placedAfter(t, ns, "after") // the placer saw the deletion while the node was there
	if get(t, sb).DeletionTimestamp.IsZero() {
		t.Fatal("the deleted sandbox's node is there: it should wait for its agent")
	}
	deleteNode(t, "or-sb", false)
	placedAfter(t, ns, "after-object") // and the node object's deletion, its Lease current
	if get(t, sb).DeletionTimestamp.IsZero() {
		t.Fatal("the deleted sandbox's node agent is there (its Lease is current): it should wait for it")
	}
	deleteNode(t, "or-sb", true)
	gone(t, sb, "once its node left")
}

// A deleted checkpoint's finalizer goes once no node that holds a copy is
// left: when the last of them is removed from the cluster after the
// deletion, and at once when its replicas name only nodes that are gone
// (the capturing node, there still, removed its own entry and copy).
func TestDeletedCheckpointReleasedWhenItsHoldersGo(t *testing.T) {
	plane.Need(t)
	startController(t)
	ns := namespace(t)
	node(t, "or-ck-a", 4, long)
	node(t, "or-ck-b", 4, long)
	ready := func(name string, replicas ...string) *fbv1.Checkpoint {
		ck := &fbv1.Checkpoint{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Finalizers: []string{fbv1.CheckpointFinalizer}},
			Spec: fbv1.CheckpointSpec{Sandbox: "src", NodeName: "or-ck-a"}}
		create(t, ck)
		setReady(t, ck, replicas...)
		return ck
	}
	both := ready("on-both", "or-ck-a", "or-ck-b")
	onB := ready("on-b", "or-ck-b")
	if err := plane.Client.Delete(context.Background(), both); err != nil {
		t.Fatal(err)
	}
	// The controller saw that deletion while both nodes were there: a
	// checkpoint made after it is given its node only after.
	src := sandbox(ns, "src2", func(sb *fbv1.Sandbox) { sb.Spec.NodeName = "or-ck-a" })
	create(t, src)
	later := &fbv1.Checkpoint{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "later"}, Spec: fbv1.CheckpointSpec{Sandbox: "src2"}}
	create(t, later)
	clustertest.Eventually(t, 30*time.Second, "the later checkpoint sent to its node", func() (bool, string) {
		return get(t, later).Spec.NodeName == "or-ck-a", later.Spec.NodeName
	})
	if get(t, both).DeletionTimestamp.IsZero() {
		t.Fatal("a checkpoint whose holders are there should wait for their agents")
	}
	deleteNode(t, "or-ck-b", true)
	// or-ck-a still holds a copy of on-both; on-b's only copy went with
	// or-ck-b (its capturing node, or-ck-a, has none).
	if err := plane.Client.Delete(context.Background(), onB); err != nil {
		t.Fatal(err)
	}
	gone(t, onB, "when its only holder is gone")
	if get(t, both).DeletionTimestamp.IsZero() {
		t.Fatal("on-both lost its deletion")
	}
	deleteNode(t, "or-ck-a", true)
	gone(t, both, "once its last holder went")
}
