package nodeagent

import (
	"context"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
	"github.com/forkbox/forkbox/internal/cluster/kube"
)

// countingReader counts the Lists it serves.
type countingReader struct {
	client.Reader
	lists int
}

func (r *countingReader) List(ctx context.Context, l client.ObjectList, o ...client.ListOption) error {
	r.lists++
	return r.Reader.List(ctx, l, o...)
}

// A node that restarted without transfers still finds the copies it
// pulled before of Checkpoints since deleted (before, it never looked, and
// those Checkpoints kept their finalizer while it lived); it stops looking
// once no Checkpoint of another node names a copy of its.
func TestForeignCopiesWithoutTransfers(t *testing.T) {
	ctx := context.Background()
	now := metav1.Now()
	ck := func(name, capturer string, deleted bool, holders ...string) *fbv1.Checkpoint {
		c := &fbv1.Checkpoint{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, Finalizers: []string{fbv1.CheckpointFinalizer}},
			Spec: fbv1.CheckpointSpec{NodeName: capturer}}
		if deleted {
			c.DeletionTimestamp = &now
		}
		for _, h := range holders {
			c.Status.Replicas = append(c.Status.Replicas, fbv1.Replica{Node: h, LocalID: "ck-" + name, Ready: true})
		}
		return c
	}
	c := fake.NewClientBuilder().WithScheme(kube.NewScheme()).WithObjects(
		ck("gone", "a", true, "a", "b"),
		ck("live", "a", false, "a", "b"),
		ck("own", "b", true, "b"),
		ck("others", "a", true, "a", "c"),
	).WithStatusSubresource(&fbv1.Checkpoint{}).Build()
	api := &countingReader{Reader: c}
	a := &agent{o: Options{NodeName: "b"}, c: c, api: api} // no transfers: a.t is nil
	gone, held, err := a.foreignCopies(ctx)
	if err != nil || !held || len(gone) != 1 || gone[0].Name != "gone" {
		t.Fatalf("foreignCopies = %v, held %v, %v; want [gone], held", names(gone), held, err)
	}

	// While another node's Checkpoint names a copy here, every heartbeat
	// looks; once none does, it stops.
	drop := func(name string) {
		t.Helper()
		var cur fbv1.Checkpoint
		if err := c.Get(ctx, client.ObjectKey{Namespace: "ns", Name: name}, &cur); err != nil {
			t.Fatal(err)
		}
		cur.Status.Replicas = cur.Status.Replicas[:1]
		if err := c.Status().Update(ctx, &cur); err != nil {
			t.Fatal(err)
		}
	}
	drop("gone") // as removing its copy does (checkpoints.remove, which needs the daemon)
	lists := api.lists
	a.collectReplicas(ctx)
	a.collectReplicas(ctx)
	if got := api.lists - lists; got != 2 {
		t.Errorf("%d lists in two heartbeats while a copy is named here, want 2", got)
	}
	drop("live")
	lists = api.lists
	a.collectReplicas(ctx)
	a.collectReplicas(ctx)
	if got := api.lists - lists; got != 1 {
		t.Errorf("%d lists in two heartbeats once no copy is named here, want 1", got)
	}
}

func names(cks []*fbv1.Checkpoint) []string {
	var out []string
	for _, c := range cks {
		out = append(out, c.Name)
	}
	return out
}
