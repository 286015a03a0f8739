package cluster

import (
	"fmt"
	"testing"
	"time"

	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
	"github.com/forkbox/forkbox/internal/cluster/clustertest"
)

// Placement is the same for both runtimes (the placer never looks at
// more than the runtime's name), so these run on crun, the fastest.

// Fork children land on the node that holds the checkpoint while it has
// room: the source is pinned to the last node, which loses on every
// other score (names, load), and all its children go there.
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
	// What happens once the node is full: TestForkSpillsAndReuses
	// (transfer_test.go).
}
