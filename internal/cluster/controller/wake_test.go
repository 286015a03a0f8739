package controller

import (
	"context"
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
	"github.com/forkbox/forkbox/internal/cluster/clustertest"
)

// A Fork of a checkpoint it does not own (a tagged one, as the gateway
// makes for a fork with a tag) waits while that checkpoint is not ready,
// and makes its children once it is: the checkpoint's change wakes it.
// The gateway creates such a Fork once its own cache shows the checkpoint
// ready, which the controller's cache may not show yet (CI run 70: a
// child never made, and no error, for 5 minutes).
func TestForkOfCheckpointNotReadyYet(t *testing.T) {
	plane.Need(t)
	startController(t)
	ns := namespace(t)
	node(t, "fs-node", 4, long)
	ck := &fbv1.Checkpoint{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "tagged"},
		Spec: fbv1.CheckpointSpec{Sandbox: "src", NodeName: "fs-node"}}
	create(t, ck)
	fk := &fbv1.Fork{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "of-tagged"},
		Spec: fbv1.ForkSpec{Source: fbv1.ForkSource{Checkpoint: "tagged"}, Count: 2}}
	create(t, fk)
	clustertest.Eventually(t, 30*time.Second, "fork Checkpointing before its checkpoint is ready", func() (bool, string) {
		get(t, fk)
		return fk.Status.Phase == fbv1.ForkCheckpointing, fmt.Sprintf("%s: %s", fk.Status.Phase, fk.Status.Message)
	})
	setReady(t, ck, "fs-node")
	for i := range 2 {
		sb := &fbv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("of-tagged-%d", i)}}
		clustertest.Eventually(t, 30*time.Second, "child "+sb.Name+" once the checkpoint is ready", func() (bool, string) {
			err := plane.Client.Get(context.Background(), client.ObjectKeyFromObject(sb), sb)
			return err == nil, fmt.Sprintf("%v; fork %s: %s", err, get(t, fk).Status.Phase, fk.Status.Message)
		})
		if sb.Spec.Source == nil || sb.Spec.Source.Checkpoint != "tagged" {
			t.Errorf("child %s: source %+v, want checkpoint tagged", sb.Name, sb.Spec.Source)
		}
	}
}
