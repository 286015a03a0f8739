package cluster

import (
	"context"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	fbclient "github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/errdefs"
	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
)

// TestGatewayForkRoom: a fork that is not best effort and asks for more
// children than the cluster has free slots is one ResourceExhausted
// error, and nothing is made (no Fork, no Checkpoint), as on one host.
func TestGatewayForkRoom(t *testing.T) {
	c := gateway(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	sb, err := c.CreateSandbox(ctx, fbclient.CreateOptions{Image: env.image, Name: "room", Runtime: string(fbv1.RuntimeCrun)})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close(context.Background())
	slots := 0
	for _, n := range nodes() {
		slots += n.Slots
	}
	var before fbv1.ForkList
	if err := plane.Client.List(ctx, &before, client.InNamespace(gw.namespace)); err != nil {
		t.Fatal(err)
	}
	// The source takes a slot: all of them for children is one too many.
	for _, o := range []fbclient.ForkOptions{{Count: slots}, {Count: slots, Tag: "room-tag"}} {
		if _, err := sb.Fork(ctx, o); !errdefs.IsResourceExhausted(err) {
			t.Errorf("fork %+v of a cluster of %d slots: got %v, want ResourceExhausted", o, slots, err)
		}
	}
	var after fbv1.ForkList
	if err := plane.Client.List(ctx, &after, client.InNamespace(gw.namespace)); err != nil {
		t.Fatal(err)
	}
	var cks fbv1.CheckpointList
	if err := plane.Client.List(ctx, &cks, client.InNamespace(gw.namespace)); err != nil {
		t.Fatal(err)
	}
	for _, ck := range cks.Items {
		if ck.Spec.Sandbox == "room" {
			t.Errorf("a refused fork took checkpoint %s", ck.Name)
		}
	}
	if len(after.Items) != len(before.Items) {
		t.Errorf("a refused fork made a Fork: %d before, %d after", len(before.Items), len(after.Items))
	}
}
