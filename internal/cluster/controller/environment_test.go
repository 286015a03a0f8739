package controller

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
	"github.com/forkbox/forkbox/internal/cluster/clustertest"
)

// setupDone writes, as the builder's node agent would, the builder
// Running with its setup's outcome.
func setupDone(t *testing.T, sb *fbv1.Sandbox, ok bool, msg string) {
	t.Helper()
	st, reason := metav1.ConditionTrue, "SetupDone"
	switch {
	case !ok && msg == "running":
		st, reason = metav1.ConditionUnknown, "Running"
	case !ok:
		st, reason = metav1.ConditionFalse, "SetupFailed"
	}
	updateStatus(t, sb, func(sb *fbv1.Sandbox) {
		sb.Status.Phase = fbv1.PhaseRunning
		meta.SetStatusCondition(&sb.Status.Conditions, metav1.Condition{Type: fbv1.ConditionSetupComplete, Status: st, Reason: reason, Message: msg})
	})
}

// awaitBuilder waits for the builder Sandbox of the environment's
// current spec, of build want (named build-<want>, as one host names
// it), and returns it, checked.
func awaitBuilder(t *testing.T, e *fbv1.Environment, want string) *fbv1.Sandbox {
	t.Helper()
	sb := &fbv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: e.Namespace, Name: fbv1.BuilderName(want)}}
	clustertest.Eventually(t, 30*time.Second, "builder "+sb.Name, func() (bool, string) {
		err := plane.Client.Get(context.Background(), client.ObjectKeyFromObject(sb), sb)
		return err == nil && sb.Spec.NodeName != "", fmt.Sprint(err, " env status: ", get(t, e).Status)
	})
	if !metav1.IsControlledBy(sb, e) || sb.Labels[fbv1.EnvironmentLabel] != e.Name || sb.Annotations[fbv1.BuildHashAnnotation] != get(t, e).Spec.Hash() {
		t.Fatalf("builder %s: owners %v, labels %v, annotations %v", sb.Name, sb.OwnerReferences, sb.Labels, sb.Annotations)
	}
	if sb.Spec.Image != e.Spec.Image || sb.Spec.Runtime != e.Spec.Runtime {
		t.Fatalf("builder spec %+v, want the environment's image and runtime", sb.Spec)
	}
	return sb
}

// awaitCapture waits for the Checkpoint of a builder whose setup is done,
// and makes it ready on node as its agent would.
func awaitCapture(t *testing.T, b *fbv1.Sandbox, node string) {
	t.Helper()
	ck := &fbv1.Checkpoint{ObjectMeta: metav1.ObjectMeta{Namespace: b.Namespace, Name: strings.TrimPrefix(b.Name, "build-")}}
	clustertest.Eventually(t, 30*time.Second, "checkpoint "+ck.Name, func() (bool, string) {
		err := plane.Client.Get(context.Background(), client.ObjectKeyFromObject(ck), ck)
		return err == nil, fmt.Sprint(err)
	})
	if ck.Spec.Sandbox != b.Name || ck.Spec.NodeName != b.Spec.NodeName {
		t.Fatalf("checkpoint spec %+v, want of %s on %s", ck.Spec, b.Name, b.Spec.NodeName)
	}
	setReady(t, ck, node)
}

// awaitBuilt waits until the environment serves checkpoint want.
func awaitBuilt(t *testing.T, e *fbv1.Environment, want string) {
	t.Helper()
	clustertest.Eventually(t, 30*time.Second, "environment built as "+want, func() (bool, string) {
		get(t, e)
		c := meta.FindStatusCondition(e.Status.Conditions, fbv1.ConditionBuilt)
		return e.Status.Checkpoint == want && e.Status.Hash == e.Spec.Hash() && e.Status.BuiltAt != nil &&
			c != nil && c.Status == metav1.ConditionTrue && meta.IsStatusConditionTrue(e.Status.Conditions, fbv1.ConditionReady), fmt.Sprintf("%+v", e.Status)
	})
}

// closedObj waits until the controller has asked builder b to close,
// then reports it Closed as its node would (the retention deletes it
// later).
func closedObj(t *testing.T, b *fbv1.Sandbox) {
	t.Helper()
	clustertest.Eventually(t, 30*time.Second, b.Name+" asked to close", func() (bool, string) {
		err := plane.Client.Get(context.Background(), client.ObjectKeyFromObject(b), b)
		return err == nil && b.Spec.State == fbv1.StateClosed, fmt.Sprint(err, " state ", b.Spec.State)
	})
	updateStatus(t, b, func(b *fbv1.Sandbox) {
		now := metav1.Now()
		b.Status.Phase, b.Status.ClosedAt = fbv1.PhaseClosed, &now
	})
}

func goneObj(t *testing.T, o client.Object) {
	t.Helper()
	clustertest.Eventually(t, 30*time.Second, o.GetName()+" deleted", func() (bool, string) {
		err := plane.Client.Get(context.Background(), client.ObjectKeyFromObject(o), o)
		return errors.IsNotFound(err), fmt.Sprint(err)
	})
}

// An Environment is built into a Checkpoint through a builder Sandbox;
// a Sandbox from it waits, then is placed where the checkpoint is. A
// changed spec rebuilds (a failed build keeps the old checkpoint
// serving and is not retried); a good rebuild replaces the checkpoint,
// and so does one after maxAge.
func TestEnvironmentBuild(t *testing.T) {
	plane.Need(t)
	startController(t)
	ns := namespace(t)
	node(t, "env-a", 4, long)
	e := &fbv1.Environment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "py"},
		Spec: fbv1.EnvironmentSpec{Image: "busybox", Runtime: fbv1.RuntimeCrun, Setup: []string{"echo one > /root/one"}}}
	create(t, e)
	user := sandbox(ns, "user", func(sb *fbv1.Sandbox) { sb.Spec.Image, sb.Spec.Source = "", &fbv1.SandboxSource{Environment: "py"} })
	create(t, user)
	unschedulable(t, user, "environment py has no built checkpoint yet")

	first := "py-" + e.Spec.Hash()[:10]
	b := awaitBuilder(t, e, first)
	if c := meta.FindStatusCondition(get(t, e).Status.Conditions, fbv1.ConditionReady); c == nil || c.Status != metav1.ConditionFalse || e.Status.Build != first {
		t.Fatalf("while building: status %+v", e.Status)
	}
	setupDone(t, b, false, "running") // the agent runs the steps: still building
	clustertest.Eventually(t, 30*time.Second, "building while the setup runs", func() (bool, string) {
		c := meta.FindStatusCondition(get(t, e).Status.Conditions, fbv1.ConditionBuilt)
		return c != nil && c.Reason == ReasonBuilding && strings.Contains(c.Message, "running"), fmt.Sprintf("%+v", c)
	})
	setupDone(t, b, true, "1 step")
	awaitCapture(t, b, "env-a")
	awaitBuilt(t, e, first)
	closedObj(t, b)
	if got := placedOn(t, user); got != "env-a" {
		t.Fatalf("user placed on %s, want env-a (holds the environment's checkpoint)", got)
	}

	// A changed spec whose setup fails: the old checkpoint keeps serving.
	update(t, e, func(e *fbv1.Environment) { e.Spec.Setup = append(e.Spec.Setup, "false") })
	bad := awaitBuilder(t, e, "py-"+e.Spec.Hash()[:10])
	setupDone(t, bad, false, "step 2 of 2 (false): exited 1")
	clustertest.Eventually(t, 30*time.Second, "build failure reported", func() (bool, string) {
		get(t, e)
		c := meta.FindStatusCondition(e.Status.Conditions, fbv1.ConditionBuilt)
		return c != nil && c.Reason == ReasonSetupFailed && fbv1.BuilderName(e.Status.Build) == bad.Name && e.Status.Checkpoint == first &&
			meta.IsStatusConditionTrue(e.Status.Conditions, fbv1.ConditionReady), fmt.Sprintf("%+v", e.Status)
	})
	closedObj(t, bad) // its slot is given back once its node has closed it

	// A good spec: rebuilt, and the first checkpoint goes.
	update(t, e, func(e *fbv1.Environment) { e.Spec.Setup = []string{"echo one > /root/one", "echo two > /root/two"} })
	second := "py-" + e.Spec.Hash()[:10]
	b2 := awaitBuilder(t, e, second)
	setupDone(t, b2, true, "2 steps")
	awaitCapture(t, b2, "env-a")
	awaitBuilt(t, e, second)
	goneObj(t, &fbv1.Checkpoint{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: first}})
	closedObj(t, b2)

	// maxAge: the same spec is rebuilt once its checkpoint is older.
	builtAt := get(t, e).Status.BuiltAt
	update(t, e, func(e *fbv1.Environment) { e.Spec.MaxAge = &metav1.Duration{Duration: 2 * time.Second} })
	if e.Spec.Hash() != e.Status.Hash {
		t.Fatalf("maxAge changed the spec's hash")
	}
	aged := second + "-" + strconv.FormatInt(builtAt.Unix(), 36)
	b3 := awaitBuilder(t, e, aged)
	if get(t, e).Status.Checkpoint != second {
		t.Fatalf("while rebuilding: checkpoint %s, want %s to keep serving", e.Status.Checkpoint, second)
	}
	setupDone(t, b3, true, "2 steps")
	awaitCapture(t, b3, "env-a")
	awaitBuilt(t, e, aged)
	if !get(t, e).Status.BuiltAt.After(builtAt.Time) {
		t.Fatalf("builtAt %s not after %s", e.Status.BuiltAt, builtAt)
	}
	goneObj(t, &fbv1.Checkpoint{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: second}})
}
