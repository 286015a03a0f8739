package nodeagent

import (
	"context"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/forkbox/forkbox/errdefs"
	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
	"github.com/forkbox/forkbox/internal/cluster/kube"
)

// TestPlacementGrants: node a serves a checkpoint only to a node with a
// sandbox placed on it that starts from it (directly, through an
// Environment, or from a descendant by spec.parent); every other pull
// is refused, PermissionDenied, naming the node and the checkpoint: one
// through a status.parent the capturing node forged, one of a local ID
// two Checkpoints name, one of a capture whose Checkpoint names another
// origin.
func TestPlacementGrants(t *testing.T) {
	const ns = "work"
	ck := func(name, local, parent string) *fbv1.Checkpoint {
		return &fbv1.Checkpoint{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: fbv1.CheckpointSpec{Parent: parent},
			Status: fbv1.CheckpointStatus{Parent: parent, Replicas: []fbv1.Replica{{Node: "a", LocalID: local, Ready: true}}}}
	}
	sb := func(ns, name, node string, src fbv1.SandboxSource) *fbv1.Sandbox {
		return &fbv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: fbv1.SandboxSpec{NodeName: node, Source: &src}}
	}
	deleting := sb(ns, "deleting", "e", fbv1.SandboxSource{Checkpoint: "other"})
	now := metav1.Now()
	deleting.DeletionTimestamp, deleting.Finalizers = &now, []string{fbv1.SandboxFinalizer}
	notReady := ck("pending", "ck-5", "")
	notReady.Status.Replicas[0].Ready = false
	elsewhere := ck("elsewhere", "ck-6", "")
	elsewhere.Status.Replicas[0].Node = "z"
	// forged: captured by g, which claims (status.parent, which the
	// capturing node writes) that its parent is victim; its creator
	// recorded none (spec.parent).
	forged := ck("forged", "ck-7", "")
	forged.Status.Replicas[0].Node = "g"
	forged.Status.Parent = "victim"
	// Two Checkpoints name a's ck-8; and ck-10 is a's capture by its
	// entry, but the Checkpoint says node z captured it.
	twinA, twinB := ck("twin-a", "ck-8", ""), ck("twin-b", "ck-8", "")
	twinB.Status.Replicas = append([]fbv1.Replica{{Node: "h", LocalID: "ck-8", Ready: true}}, twinB.Status.Replicas...)
	misOrigin := ck("mis-origin", "ck-10", "")
	misOrigin.Spec.NodeName, misOrigin.Status.OriginNode = "a", "z"
	captured := ck("captured", "ck-11", "")
	captured.Spec.NodeName, captured.Status.OriginNode = "a", "a"
	objs := []client.Object{
		ck("victim", "ck-V", ""), forged, twinA, twinB, misOrigin, captured,
		sb(ns, "on-g", "g", fbv1.SandboxSource{Checkpoint: "forged"}),
		sb(ns, "on-h", "h", fbv1.SandboxSource{Checkpoint: "twin-b"}),
		sb(ns, "on-i", "i", fbv1.SandboxSource{Checkpoint: "mis-origin"}),
		sb(ns, "on-j", "j", fbv1.SandboxSource{Checkpoint: "captured"}),
		ck("base", "ck-1", ""), ck("child", "ck-2", "base"), ck("grandchild", "ck-4", "child"), ck("other", "ck-3", ""), notReady, elsewhere,
		&fbv1.Environment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "env"}, Status: fbv1.EnvironmentStatus{Checkpoint: "other"}},
		sb(ns, "on-b", "b", fbv1.SandboxSource{Checkpoint: "base"}),
		sb(ns, "on-c", "c", fbv1.SandboxSource{Checkpoint: "grandchild"}),
		sb(ns, "on-d", "d", fbv1.SandboxSource{Environment: "env"}),
		deleting,
		sb(ns, "unplaced", "", fbv1.SandboxSource{Checkpoint: "other"}),
		sb("elsewhere", "same-name", "b", fbv1.SandboxSource{Checkpoint: "other"}),
		sb(ns, "pending-on-b", "b", fbv1.SandboxSource{Checkpoint: "pending"}),
	}
	c := fake.NewClientBuilder().WithScheme(kube.NewScheme()).WithObjects(objs...).
		WithIndex(&fbv1.Sandbox{}, fbv1.NodeNameField, func(o client.Object) []string { return []string{o.(*fbv1.Sandbox).Spec.NodeName} }).
		Build()
	g := placementGrants{api: c, node: "a"}
	for _, tc := range []struct {
		peer, id string
		ok       bool
		why      string
	}{
		{"b", "ck-1", true, "its sandbox starts from base"},
		{"b", "ck-3", false, "no sandbox of b starts from other (one in another namespace does)"},
		{"b", "ck-2", false, "child is a descendant of b's source, not an ancestor"},
		{"c", "ck-4", true, "its sandbox starts from grandchild"},
		{"c", "ck-2", true, "child is an ancestor of c's source"},
		{"c", "ck-1", true, "base is an ancestor of c's source"},
		{"d", "ck-3", true, "its sandbox starts from env, whose checkpoint is other"},
		{"d", "ck-1", false, "env's checkpoint is other, not base"},
		{"e", "ck-3", false, "its sandbox is being deleted"},
		{"f", "ck-3", false, "no sandbox is placed on f (an unplaced one starts from other)"},
		{"b", "ck-5", false, "a's copy of pending is not ready"},
		{"b", "ck-6", false, "the copy is z's, not a's"},
		{"b", "ck-9", false, "no checkpoint has that ID"},
		{"g", "ck-V", false, "forged's status.parent names victim, its spec.parent nothing"},
		{"h", "ck-8", false, "twin-a and twin-b both name ck-8 as a's copy"},
		{"i", "ck-10", false, "mis-origin was a's to capture but says z captured it"},
		{"j", "ck-11", true, "captured is a's capture and its sandbox starts from it"},
	} {
		err := g.MayPull(context.Background(), tc.peer, tc.id)
		if tc.ok {
			if err != nil {
				t.Errorf("%s pulls %s (%s): got %v, want allowed", tc.peer, tc.id, tc.why, err)
			}
			continue
		}
		if !errdefs.IsPermissionDenied(err) || !strings.Contains(err.Error(), "node "+tc.peer+" may not pull checkpoint "+tc.id) {
			t.Errorf("%s pulls %s (%s): got %v, want PermissionDenied naming the node and the checkpoint", tc.peer, tc.id, tc.why, err)
		}
	}
}
