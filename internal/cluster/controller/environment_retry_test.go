package controller

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
	"github.com/forkbox/forkbox/internal/cluster/clustertest"
)

// awaitFailed waits until the environment's build failed with reason.
func awaitFailed(t *testing.T, e *fbv1.Environment, build, reason string) *metav1.Condition {
	t.Helper()
	var c *metav1.Condition
	clustertest.Eventually(t, 30*time.Second, "build "+build+" failed with "+reason, func() (bool, string) {
		get(t, e)
		c = meta.FindStatusCondition(e.Status.Conditions, fbv1.ConditionBuilt)
		return c != nil && c.Status == metav1.ConditionFalse && c.Reason == reason && e.Status.Build == build, fmt.Sprintf("%+v", e.Status)
	})
	return c
}

// A failed build is tried again once the Environment's retry count is
// raised, under a new build name; a builder its node refused to create
// fails the build with the node's reason (naming the class), and goes;
// a deleted Environment's checkpoint and builders are collected.
func TestEnvironmentRetryAndCollect(t *testing.T) {
	plane.Need(t)
	startController(t)
	ns := namespace(t)
	node(t, "retry-a", 4, long)
	ctx := context.Background()
	e := &fbv1.Environment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "flaky"},
		Spec: fbv1.EnvironmentSpec{Image: "busybox", Runtime: fbv1.RuntimeCrun, Setup: []string{"curl example.com"}}}
	create(t, e)
	first := "flaky-" + e.Spec.Hash()[:10]
	b := awaitBuilder(t, e, first)
	setupDone(t, b, false, "step 1 of 1 (curl example.com): exited 6")
	awaitFailed(t, e, first, ReasonSetupFailed)
	closedObj(t, b)

	// Not tried again by itself; tried again once asked.
	if got := fbv1.BuildName(get(t, e), e.Spec.Hash()); got != first {
		t.Fatalf("build name of a failed build: got %s, want %s", got, first)
	}
	update(t, e, func(e *fbv1.Environment) { e.Annotations = map[string]string{fbv1.RetryAnnotation: "1"} })
	retry := first + "-r1"
	b = awaitBuilder(t, e, retry)
	// Its node refuses to create it (an image it does not have).
	updateStatus(t, b, func(b *fbv1.Sandbox) {
		b.Status.Phase = fbv1.PhaseFailed
		b.Status.Message = `image "busybox" not found`
		meta.SetStatusCondition(&b.Status.Conditions, metav1.Condition{Type: fbv1.ConditionReady, Status: metav1.ConditionFalse,
			Reason: "CreateFailedNotFound", Message: b.Status.Message})
	})
	c := awaitFailed(t, e, retry, "CreateFailedNotFound")
	if want := `builder sandbox failed on node retry-a: image "busybox" not found`; !strings.Contains(c.Message, want) {
		t.Fatalf("failure message %q, want it to say %q", c.Message, want)
	}
	closedObj(t, b)

	// Tried again, and built this time.
	update(t, e, func(e *fbv1.Environment) { e.Annotations[fbv1.RetryAnnotation] = "2" })
	third := first + "-r2"
	b = awaitBuilder(t, e, third)
	setupDone(t, b, true, "1 step")
	awaitCapture(t, b, "retry-a")
	awaitBuilt(t, e, third)
	if got := fbv1.BuildName(get(t, e), e.Spec.Hash()); got != third {
		t.Fatalf("build name once built: got %s, want the checkpoint's %s", got, third)
	}

	// Deleted: its checkpoint goes (no garbage collector runs here). Its
	// node holds a copy a while (the finalizer), and an Environment of
	// the same name and spec made meanwhile does not take it for its own.
	ck := &fbv1.Checkpoint{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: third}}
	update(t, ck, func(ck *fbv1.Checkpoint) { ck.Finalizers = []string{fbv1.CheckpointFinalizer} })
	if err := plane.Client.Delete(ctx, e); err != nil {
		t.Fatal(err)
	}
	clustertest.Eventually(t, 30*time.Second, "checkpoint "+ck.Name+" deleted", func() (bool, string) {
		return !get(t, ck).DeletionTimestamp.IsZero(), "not yet"
	})
	again := &fbv1.Environment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "flaky", Annotations: map[string]string{fbv1.RetryAnnotation: "2"}},
		Spec: e.Spec}
	create(t, again)
	b = awaitBuilder(t, again, third) // the same build name
	setupDone(t, b, true, "1 step")
	clustertest.Eventually(t, 30*time.Second, "waiting for the old checkpoint", func() (bool, string) {
		c := meta.FindStatusCondition(get(t, again).Status.Conditions, fbv1.ConditionBuilt)
		return c != nil && strings.Contains(c.Message, "earlier environment"), fmt.Sprintf("%+v", again.Status)
	})
	if again.Status.Checkpoint != "" {
		t.Fatalf("the new environment took the old one's checkpoint: %+v", again.Status)
	}
	update(t, ck, func(ck *fbv1.Checkpoint) { ck.Finalizers = nil }) // its node let it go
	awaitCapture(t, b, "retry-a")
	awaitBuilt(t, again, third)
	if ck := get(t, &fbv1.Checkpoint{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: third}}); !metav1.IsControlledBy(ck, again) {
		t.Fatalf("checkpoint %s: owners %v, want the new environment", ck.Name, ck.OwnerReferences)
	}
}

// A client-run setup (spec.setupHash): the builder is left to a client
// (no node agent runs steps in it: no build-hash annotation); the
// client's word on it (SetupResultAnnotation) fails the build with its
// message, or, on a retry, lets it be captured and built.
func TestEnvironmentClientSetup(t *testing.T) {
	plane.Need(t)
	startController(t)
	ns := namespace(t)
	node(t, "client-a", 4, long)
	ctx := context.Background()
	e := &fbv1.Environment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "fn"},
		Spec: fbv1.EnvironmentSpec{Image: "busybox", Runtime: fbv1.RuntimeCrun, SetupHash: "abc123"}}
	create(t, e)
	first := "fn-" + e.Spec.Hash()[:10]
	b := &fbv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fbv1.BuilderName(first)}}
	clustertest.Eventually(t, 30*time.Second, "builder "+b.Name, func() (bool, string) {
		err := plane.Client.Get(ctx, client.ObjectKeyFromObject(b), b)
		return err == nil && b.Spec.NodeName != "", fmt.Sprint(err)
	})
	if _, ok := b.Annotations[fbv1.BuildHashAnnotation]; ok || !metav1.IsControlledBy(b, e) {
		t.Fatalf("builder of a client-run setup: annotations %v, owners %v", b.Annotations, b.OwnerReferences)
	}
	setPhase(t, b, fbv1.PhaseRunning)
	clustertest.Eventually(t, 30*time.Second, "waiting for a client", func() (bool, string) {
		c := meta.FindStatusCondition(get(t, e).Status.Conditions, fbv1.ConditionBuilt)
		return c != nil && c.Reason == ReasonBuilding && strings.Contains(c.Message, "waiting for a client"), fmt.Sprintf("%+v", c)
	})
	clientSays := func(b *fbv1.Sandbox, result string) {
		t.Helper()
		update(t, b, func(b *fbv1.Sandbox) {
			b.Annotations = map[string]string{fbv1.LeaseAnnotation: "lease-1", fbv1.SetupResultAnnotation: result}
		})
	}
	clientSays(b, "failed: setup broke")
	c := awaitFailed(t, e, first, ReasonSetupFailed)
	if !strings.Contains(c.Message, "setup broke") {
		t.Fatalf("failure message %q, want the client's", c.Message)
	}
	closedObj(t, b)

	update(t, e, func(e *fbv1.Environment) { e.Annotations = map[string]string{fbv1.RetryAnnotation: "1"} })
	b = &fbv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fbv1.BuilderName(first + "-r1")}}
	clustertest.Eventually(t, 30*time.Second, "builder "+b.Name, func() (bool, string) {
		err := plane.Client.Get(ctx, client.ObjectKeyFromObject(b), b)
		return err == nil && b.Spec.NodeName != "", fmt.Sprint(err)
	})
	setPhase(t, b, fbv1.PhaseRunning)
	clientSays(b, "ok")
	awaitCapture(t, b, "client-a")
	awaitBuilt(t, e, first+"-r1")
	closedObj(t, b)
}
