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

// A sandbox of an environment whose checkpoint this controller's cache
// does not show ready yet (a fresh cache, after a leader change, lists
// Environments and Checkpoints apart) is placed once it is ready: the
// checkpoint's change reaches the sandboxes of the environments it
// serves, not only those that name it.
func TestEnvironmentSandboxWaitsForItsCheckpoint(t *testing.T) {
	plane.Need(t)
	startController(t)
	ns := namespace(t)
	node(t, "env-wait", 4, long)
	e := &fbv1.Environment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "built"},
		Spec: fbv1.EnvironmentSpec{Image: "busybox", Runtime: fbv1.RuntimeCrun, Setup: []string{"true"}}}
	create(t, e)
	hash := e.Spec.Hash()
	build := fbv1.BuildName(e, hash)
	ck := &fbv1.Checkpoint{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: build}, Spec: fbv1.CheckpointSpec{Sandbox: "gone", NodeName: "env-wait"}}
	create(t, ck)
	// Its status as the environment controller writes it once built (here
	// before the checkpoint shows ready).
	updateStatus(t, e, func(e *fbv1.Environment) { e.Status.Checkpoint, e.Status.Hash, e.Status.Build = build, hash, build })
	sb := sandbox(ns, "of-env", func(sb *fbv1.Sandbox) { sb.Spec.Image, sb.Spec.Source = "", &fbv1.SandboxSource{Environment: "built"} })
	create(t, sb)
	clustertest.Eventually(t, 30*time.Second, "the sandbox waiting for the checkpoint", func() (bool, string) {
		get(t, sb)
		return sb.Status.Message != "" && sb.Spec.NodeName == "", fmt.Sprintf("node %q: %s", sb.Spec.NodeName, sb.Status.Message)
	})
	setReady(t, ck, "env-wait")
	if got := placedOn(t, sb); got != "env-wait" {
		t.Fatalf("placed on %s, want env-wait", got)
	}
}
