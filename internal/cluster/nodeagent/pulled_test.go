package nodeagent

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/forkbox/forkbox/errdefs"
	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
	"github.com/forkbox/forkbox/internal/cluster/kube"
)

// A pulled copy is recorded on its Checkpoint; one whose Checkpoint was
// deleted while it came (gone, or another of the same name made since) is
// listed nowhere, and nothing else would remove it: the puller deletes it
// and the pull fails NotFound. The later Checkpoint is left as it is.
func TestPulledCopyOfDeletedCheckpoint(t *testing.T) {
	ctx := context.Background()
	ck := func(uid string) *fbv1.Checkpoint {
		return &fbv1.Checkpoint{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "ck", UID: types.UID("uid-" + uid)},
			Status: fbv1.CheckpointStatus{Phase: fbv1.CheckpointReady, Replicas: []fbv1.Replica{{Node: "a", LocalID: "ck-1", Ready: true}}}}
	}
	for _, tc := range []struct {
		name    string
		api     []client.Object
		dropped bool
	}{
		{"there", []client.Object{ck("1")}, false},
		{"deleted", nil, true},
		{"deleted and made again", []client.Object{ck("2")}, true},
	} {
		c := fake.NewClientBuilder().WithScheme(kube.NewScheme()).WithObjects(tc.api...).WithStatusSubresource(&fbv1.Checkpoint{}).Build()
		a := &agent{o: Options{NodeName: "b"}, c: c, api: c, rec: events.NewFakeRecorder(10), log: slog.New(slog.NewTextHandler(io.Discard, nil))}
		var dropped []string
		drop := func(_ context.Context, id string) error { dropped = append(dropped, id); return nil }
		err := a.recordPulled(ctx, ck("1"), "ck-1", "Transferred", "pulled", drop)
		if tc.dropped {
			if !errdefs.IsNotFound(err) || !slices.Equal(dropped, []string{"ck-1"}) {
				t.Errorf("%s: got %v, dropped %v; want NotFound and ck-1 dropped", tc.name, err, dropped)
			}
		} else if err != nil || len(dropped) != 0 {
			t.Errorf("%s: got %v, dropped %v; want it recorded", tc.name, err, dropped)
		}
		var got fbv1.Checkpoint
		if err := c.Get(ctx, client.ObjectKey{Namespace: "ns", Name: "ck"}, &got); err != nil {
			continue
		}
		mine := slices.ContainsFunc(got.Status.Replicas, func(r fbv1.Replica) bool { return r.Node == "b" })
		if mine == tc.dropped {
			t.Errorf("%s: replicas %+v: want node b's entry %v", tc.name, got.Status.Replicas, !tc.dropped)
		}
	}
}
