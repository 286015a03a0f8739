package cluster

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
	"github.com/forkbox/forkbox/internal/cluster/clustertest"
)

// testNamespace is namespace(t), and deletes its Sandboxes, Forks and
// Checkpoints when t ends, waiting until the nodes let them go (so the
// next test finds every slot free). Call it before keepRunning, so the
// nodes run again first.
func testNamespace(t testing.TB) string {
	t.Helper()
	ns := namespace(t)
	t.Cleanup(func() { deleteAll(t, ns) })
	return ns
}

func deleteAll(t testing.TB, ns string) {
	ctx := context.Background()
	c := plane.Client
	for _, o := range []client.Object{&fbv1.Environment{}, &fbv1.Fork{}, &fbv1.Sandbox{}, &fbv1.Checkpoint{}} {
		if err := c.DeleteAllOf(ctx, o, client.InNamespace(ns)); err != nil {
			t.Errorf("delete %T in %s: %v", o, ns, err)
		}
	}
	clustertest.Eventually(t, 2*time.Minute, "objects of "+ns+" gone", func() (bool, string) {
		var sl fbv1.SandboxList
		var cl fbv1.CheckpointList
		if err := c.List(ctx, &sl, client.InNamespace(ns)); err != nil {
			return false, err.Error()
		}
		if err := c.List(ctx, &cl, client.InNamespace(ns)); err != nil {
			return false, err.Error()
		}
		return len(sl.Items)+len(cl.Items) == 0, fmt.Sprintf("%d sandboxes, %d checkpoints left", len(sl.Items), len(cl.Items))
	})
}

func create(t testing.TB, o client.Object) {
	t.Helper()
	if err := plane.Client.Create(context.Background(), o); err != nil {
		t.Fatalf("create %s: %v", o.GetName(), err)
	}
}

// newSandbox is a Sandbox of the test image; on node (pinned) unless
// node is "", then the placer chooses.
func newSandbox(ns, name, node string, rt fbv1.Runtime) *fbv1.Sandbox {
	return &fbv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: fbv1.SandboxSpec{Image: env.image, Runtime: rt, NodeName: node}}
}

// fork creates a Fork of count children of the sandbox source.
func fork(t *testing.T, ns, name, source string, count int32) *fbv1.Fork {
	t.Helper()
	fk := &fbv1.Fork{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: fbv1.ForkSpec{Source: fbv1.ForkSource{Sandbox: source}, Count: count}}
	create(t, fk)
	return fk
}

// child waits until the i-th child of fk exists and returns it.
func child(t *testing.T, fk *fbv1.Fork, i int) *fbv1.Sandbox {
	t.Helper()
	sb := &fbv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: fk.Namespace, Name: fmt.Sprintf("%s-%d", fk.Name, i)}}
	clustertest.Eventually(t, 2*time.Minute, "child "+sb.Name, func() (bool, string) {
		err := plane.Client.Get(context.Background(), client.ObjectKeyFromObject(sb), sb)
		return err == nil, fmt.Sprint(err, "; fork: ", get(t, fk).Status.Message)
	})
	return sb
}

// condition is sb's condition of type typ (nil if none).
func condition(sb *fbv1.Sandbox, typ string) *metav1.Condition {
	return meta.FindStatusCondition(sb.Status.Conditions, typ)
}

// hasEvent reports whether an Event of reason about o exists.
func hasEvent(t *testing.T, o client.Object, reason string) (bool, string) {
	var evs corev1.EventList
	if err := plane.Client.List(context.Background(), &evs, client.InNamespace(o.GetNamespace())); err != nil {
		return false, err.Error()
	}
	var seen []string
	for _, e := range evs.Items {
		if e.InvolvedObject.Name == o.GetName() && e.InvolvedObject.UID == o.GetUID() {
			if e.Reason == reason {
				return true, ""
			}
			seen = append(seen, e.Reason)
		}
	}
	return false, "events: " + strings.Join(seen, ", ")
}

// closedKept waits until sb is closed on its node and its object kept,
// as one host keeps a closed sandbox's record: phase Closed, no
// finalizer, its local sandbox closed and nothing of it left on the host.
func closedKept(t *testing.T, sb *fbv1.Sandbox) {
	t.Helper()
	ctx := context.Background()
	clustertest.Eventually(t, 2*time.Minute, sb.Name+" closed and kept", func() (bool, string) {
		err := plane.Client.Get(ctx, client.ObjectKeyFromObject(sb), sb)
		return err == nil && sb.Closed() && len(sb.Finalizers) == 0, fmt.Sprint(err, " phase ", sb.Status.Phase, " finalizers ", sb.Finalizers)
	})
	n := nodeNamed(sb.Spec.NodeName)
	if n == nil {
		t.Fatalf("sandbox %s: no node %q", sb.Name, sb.Spec.NodeName)
	}
	if l, err := n.Client.Sandbox(ctx, sb.Status.LocalID); err != nil || l.Info.State != "closed" {
		t.Fatalf("local sandbox %s of %s on %s: %v, %v; want it closed", sb.Status.LocalID, sb.Name, n.Name, l, err)
	}
	clustertest.Eventually(t, time.Minute, "nothing of "+sb.Status.LocalID+" left", func() (bool, string) {
		l := n.Leftovers(sb.Status.LocalID)
		return len(l) == 0, strings.Join(l, "\n")
	})
}

// gone waits until o no longer exists.
func gone(t *testing.T, o client.Object) {
	t.Helper()
	clustertest.Eventually(t, 2*time.Minute, o.GetName()+" gone", func() (bool, string) {
		err := plane.Client.Get(context.Background(), client.ObjectKeyFromObject(o), o)
		return errors.IsNotFound(err), fmt.Sprint(err, " finalizers ", o.GetFinalizers())
	})
}
