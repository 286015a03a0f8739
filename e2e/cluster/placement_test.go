package cluster

import (
	"fmt"
	"strings"
	"testing"
	"time"

	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
	"github.com/forkbox/forkbox/internal/cluster/clustertest"
	"github.com/forkbox/forkbox/internal/cluster/controller"
)

// Placement is the same for both runtimes (the placer never looks at
// more than the runtime's name), so these run on crun, the fastest.

// Fork children land on the node that holds the checkpoint while it has
// room: the source is pinned to the last node, which loses on every
// other score (names, load), and all its children go there. Once it is
// full, a fork's children have the checkpoint on no node with room: they
// stay Pending with the FailedPrecondition "checkpoint ... not on any
// node with room" (issue 15 replaces this with a transfer), on the child
// Sandboxes, their Fork and an Event, and are bound to no node.
func TestForkPlacement(t *testing.T) {
	needNodes(t, 3)
	ns := testNamespace(t)
	src := node(len(nodes()) - 1)
	box := newSandbox(ns, "src", src.Name, fbv1.RuntimeCrun)
	create(t, box)
	local := running(t, box, fbv1.PhaseRunning)
	sh(t, local, "echo from-src > /root/marker")

	// Slots - 1 children fit beside the source on its node.
	fill := int32(src.Slots - 1)
	fk := fork(t, ns, "fill", "src", fill)
	for i := range int(fill) {
		c := running(t, child(t, fk, i), fbv1.PhaseRunning)
		if got := get(t, child(t, fk, i)).Spec.NodeName; got != src.Name {
			t.Fatalf("child %d on %s, want %s (the checkpoint's node, with room)", i, got, src.Name)
		}
		if got := sh(t, c, "cat /root/marker"); got != "from-src\n" {
			t.Fatalf("child %d: got %q, want the source's file", i, got)
		}
	}
	clustertest.Eventually(t, time.Minute, "fork fill complete", func() (bool, string) {
		get(t, fk)
		return fk.Status.Phase == fbv1.ForkComplete && fk.Status.Ready == fill, fmt.Sprintf("%+v", fk.Status)
	})
	for _, c := range fk.Status.Children {
		if c.Node != src.Name {
			t.Fatalf("fork status: child %s on %q, want %s", c.Name, c.Node, src.Name)
		}
	}

	// The node is full: the next fork's checkpoint is captured there,
	// and its children fit nowhere that holds it.
	over := fork(t, ns, "over", "src", 2)
	for i := range 2 {
		c := child(t, over, i)
		want := "checkpoint over not on any node with room"
		clustertest.Eventually(t, time.Minute, "child "+c.Name+" refused", func() (bool, string) {
			get(t, c)
			cond := condition(c, fbv1.ConditionScheduled)
			return cond != nil && cond.Status == "False" && cond.Reason == controller.ReasonCheckpointUnavailable &&
					strings.Contains(cond.Message, want) && strings.Contains(c.Status.Message, "failed precondition") &&
					c.Status.Phase == fbv1.PhasePending,
				fmt.Sprintf("phase %q, message %q, scheduled %+v", c.Status.Phase, c.Status.Message, cond)
		})
		if c.Spec.NodeName != "" {
			t.Fatalf("child %s bound to %s although no node with room holds its checkpoint", c.Name, c.Spec.NodeName)
		}
		for _, n := range nodes() {
			if n != src && !strings.Contains(c.Status.Message, n.Name+": does not hold checkpoint over") {
				t.Errorf("message %q does not say that %s lacks the checkpoint", c.Status.Message, n.Name)
			}
		}
		if !strings.Contains(c.Status.Message, src.Name+": full") {
			t.Errorf("message %q does not say that %s is full", c.Status.Message, src.Name)
		}
		clustertest.Eventually(t, 30*time.Second, "FailedScheduling event of "+c.Name, func() (bool, string) {
			return hasEvent(t, c, "FailedScheduling")
		})
	}
	clustertest.Eventually(t, 30*time.Second, "fork over reports its children", func() (bool, string) {
		get(t, over)
		n := 0
		for _, c := range over.Status.Children {
			if strings.Contains(c.Message, "not on any node with room") {
				n++
			}
		}
		return n == 2 && over.Status.Ready == 0, fmt.Sprintf("%+v", over.Status)
	})
}
