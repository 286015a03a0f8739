package cluster

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/forkbox/forkbox/errdefs"
	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
	"github.com/forkbox/forkbox/internal/cluster/clustertest"
	"github.com/forkbox/forkbox/internal/cluster/controller"
	"github.com/forkbox/forkbox/internal/cluster/kube"
)

// A node whose agent stops renews no Lease: once it lapses the node is
// NotReady, its Sandbox is reported Lost (condition and Event) and not
// recreated elsewhere, and nothing new is placed on it, not even a
// sandbox whose checkpoint only it holds. When the agent is back the
// Sandbox is Running again, the same one, and the waiting one is placed.
func TestLeaseExpiryNodeLost(t *testing.T) {
	needNodes(t, 2)
	ctx := context.Background()
	ns := testNamespace(t)
	keepRunning(t)
	n := node(0)
	lost := newSandbox(ns, "lost", n.Name, fbv1.RuntimeCrun)
	create(t, lost)
	local := running(t, lost, fbv1.PhaseRunning)
	localID := lost.Status.LocalID
	ck := &fbv1.Checkpoint{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "only-there"}, Spec: fbv1.CheckpointSpec{Sandbox: "lost"}}
	create(t, ck)
	clustertest.Eventually(t, time.Minute, "checkpoint on "+n.Name, func() (bool, string) {
		get(t, ck)
		return ck.ReadyOn(n.Name), fmt.Sprintf("%+v", ck.Status)
	})

	if err := n.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	fn := &fbv1.ForkboxNode{ObjectMeta: metav1.ObjectMeta{Name: n.Name}}
	clustertest.Eventually(t, 2*time.Minute, n.Name+" NotReady", func() (bool, string) {
		get(t, fn)
		c := condition(&fbv1.Sandbox{Status: fbv1.SandboxStatus{Conditions: fn.Status.Conditions}}, fbv1.ConditionReady)
		return c != nil && c.Status == "False" && c.Reason == controller.ReasonLeaseExpired, fmt.Sprintf("%+v", c)
	})
	clustertest.Eventually(t, time.Minute, "lost reported Lost", func() (bool, string) {
		get(t, lost)
		c := condition(lost, fbv1.ConditionReady)
		return lost.Status.Phase == fbv1.PhaseLost && c != nil && c.Status == "False" && c.Reason == controller.ReasonNodeLost,
			fmt.Sprintf("phase %q, ready %+v", lost.Status.Phase, c)
	})
	clustertest.Eventually(t, 30*time.Second, "NodeLost event", func() (bool, string) { return hasEvent(t, lost, controller.ReasonNodeLost) })

	// Nothing new goes there: a fresh sandbox lands elsewhere, and one
	// from the checkpoint only the lost node holds waits.
	fresh := newSandbox(ns, "fresh", "", fbv1.RuntimeCrun)
	create(t, fresh)
	running(t, fresh, fbv1.PhaseRunning)
	if fresh.Spec.NodeName == n.Name {
		t.Fatalf("fresh placed on %s, whose Lease lapsed", n.Name)
	}
	waits := &fbv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "waits"},
		Spec: fbv1.SandboxSpec{Source: &fbv1.SandboxSource{Checkpoint: "only-there"}}}
	create(t, waits)
	clustertest.Eventually(t, time.Minute, "waits refused", func() (bool, string) {
		get(t, waits)
		return strings.Contains(waits.Status.Message, n.Name+": not ready") &&
			strings.Contains(waits.Status.Message, errdefs.ErrFailedPrecondition.Error()), waits.Status.Message
	})
	if waits.Spec.NodeName != "" {
		t.Fatalf("waits bound to %s", waits.Spec.NodeName)
	}
	// Not recreated: still bound to the lost node, no copy on the others.
	if get(t, lost).Spec.NodeName != n.Name {
		t.Fatalf("lost moved to %s", lost.Spec.NodeName)
	}
	for _, o := range nodes() {
		if o == n {
			continue
		}
		if _, err := o.Client.Sandbox(ctx, kube.LocalSandboxName(lost)); err == nil {
			t.Fatalf("lost was recreated on %s", o.Name)
		}
	}

	// The node comes back: the same sandbox runs again, and the waiting
	// one is placed where its checkpoint is.
	if err := n.Start(ctx); err != nil {
		t.Fatal(err)
	}
	clustertest.Eventually(t, 2*time.Minute, "lost Running again", func() (bool, string) {
		get(t, lost)
		return lost.Status.Phase == fbv1.PhaseRunning && kube.IsTrue(lost.Status.Conditions, fbv1.ConditionReady), fmt.Sprintf("%+v", lost.Status)
	})
	if lost.Status.LocalID != localID {
		t.Fatalf("local ID after the node came back: %s, want %s", lost.Status.LocalID, localID)
	}
	if got := sh(t, local, "echo still"); got != "still\n" {
		t.Fatalf("exec after the node came back: %q", got)
	}
	running(t, waits, fbv1.PhaseRunning)
	if waits.Spec.NodeName != n.Name {
		t.Fatalf("waits placed on %s, want %s (its checkpoint's node)", waits.Spec.NodeName, n.Name)
	}
}
