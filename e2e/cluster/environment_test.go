package cluster

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
	"github.com/forkbox/forkbox/internal/cluster/controller"
)

// builtAs waits until e serves a checkpoint built from its current spec
// (other than not) and returns the checkpoint's name.
func builtAs(t *testing.T, e *fbv1.Environment, not string) string {
	t.Helper()
	clustertest.Eventually(t, 3*time.Minute, "environment "+e.Name+" built", func() (bool, string) {
		get(t, e)
		return e.Status.Checkpoint != "" && e.Status.Checkpoint != not && e.Status.Hash == e.Spec.Hash() && e.Status.BuiltAt != nil &&
				meta.IsStatusConditionTrue(e.Status.Conditions, fbv1.ConditionBuilt) && meta.IsStatusConditionTrue(e.Status.Conditions, fbv1.ConditionReady),
			fmt.Sprintf("%+v", e.Status)
	})
	return e.Status.Checkpoint
}

func fromEnv(ns, name, env string) *fbv1.Sandbox {
	return &fbv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: fbv1.SandboxSpec{Source: &fbv1.SandboxSource{Environment: env}}}
}

// An Environment is built on a node of the cluster: a builder Sandbox
// runs its setup, a Checkpoint of it is captured, the builder is closed
// (kept, as one host keeps a closed builder's record). A
// Sandbox from the environment starts from that checkpoint, on the node
// that holds it, with the setup's files and the environment's env. A
// spec whose setup fails is reported and the old checkpoint serves on;
// a good change rebuilds, and sandboxes of the old build keep running.
// Once the holder is full, a sandbox of the environment goes to another
// node, which pulls the checkpoint.
func TestEnvironmentInCluster(t *testing.T) {
	needNodes(t, 2)
	forEachRuntime(t, func(t *testing.T, rt fbv1.Runtime) {
		ns := testNamespace(t)
		e := &fbv1.Environment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "tools"},
			Spec: fbv1.EnvironmentSpec{Image: env.image, Runtime: rt, Env: []fbv1.EnvVar{{Name: "GREETING", Value: "hi"}},
				Setup: []string{"mkdir -p /opt/tool", "echo v1 > /opt/tool/version", `echo "$GREETING from setup" > /root/greeting`}}}
		create(t, e)
		first := builtAs(t, e, "")
		ck := get(t, &fbv1.Checkpoint{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: first}})
		holder := nodeNamed(ck.Status.OriginNode)
		if holder == nil || !ck.ReadyOn(holder.Name) {
			t.Fatalf("checkpoint %s: status %+v", first, ck.Status)
		}
		builder := &fbv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fbv1.BuilderName(first)}}
		closedKept(t, builder)

		user := fromEnv(ns, "user", "tools")
		create(t, user)
		lu := running(t, user, fbv1.PhaseRunning)
		if user.Spec.NodeName != holder.Name {
			t.Fatalf("user on %s, want %s (holds the environment's checkpoint)", user.Spec.NodeName, holder.Name)
		}
		if got := sh(t, lu, `cat /opt/tool/version /root/greeting; echo "$GREETING"`); got != "v1\nhi from setup\nhi\n" {
			t.Fatalf("sandbox from the environment: got %q", got)
		}

		// A failing step: reported, and the built checkpoint serves on.
		update(t, e, func(e *fbv1.Environment) { e.Spec.Setup = append(e.Spec.Setup, "echo broken >&2; exit 3") })
		clustertest.Eventually(t, 3*time.Minute, "failed build reported", func() (bool, string) {
			get(t, e)
			c := meta.FindStatusCondition(e.Status.Conditions, fbv1.ConditionBuilt)
			return c != nil && c.Status == metav1.ConditionFalse && c.Reason == controller.ReasonSetupFailed &&
				strings.Contains(c.Message, "step 4 of 4") && strings.Contains(c.Message, "exited 3") && strings.Contains(c.Message, "broken") &&
				e.Status.Checkpoint == first && meta.IsStatusConditionTrue(e.Status.Conditions, fbv1.ConditionReady), fmt.Sprintf("%+v", e.Status)
		})
		closedKept(t, &fbv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fbv1.BuilderName(e.Status.Build)}})

		// A good change: rebuilt; the old build's sandbox keeps running.
		update(t, e, func(e *fbv1.Environment) {
			e.Spec.Setup = []string{"mkdir -p /opt/tool", "echo v2 > /opt/tool/version"}
		})
		second := builtAs(t, e, first)
		gone(t, &fbv1.Checkpoint{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: first}})
		user2 := fromEnv(ns, "user2", "tools")
		create(t, user2)
		if got := sh(t, running(t, user2, fbv1.PhaseRunning), "cat /opt/tool/version"); got != "v2\n" {
			t.Fatalf("sandbox of the rebuilt environment: got %q", got)
		}
		if got := sh(t, lu, "cat /opt/tool/version"); got != "v1\n" {
			t.Fatalf("sandbox of the first build after the rebuild: got %q", got)
		}

		// Fill the holder of the new checkpoint; the next one spills to a
		// node that pulls it (cross-node transfer, transfer_test.go).
		holder = nodeNamed(get(t, &fbv1.Checkpoint{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: second}}).Status.OriginNode)
		for i := 0; ; i++ {
			sb := fromEnv(ns, fmt.Sprintf("fill-%d", i), "tools")
			create(t, sb)
			l := running(t, sb, fbv1.PhaseRunning)
			if sb.Spec.NodeName != holder.Name {
				if i+2 < holder.Slots-1 { // user and user2 may be elsewhere: at least the free slots were used
					t.Fatalf("%s spilled to %s after %d fills", sb.Name, sb.Spec.NodeName, i)
				}
				if got := sh(t, l, "cat /opt/tool/version"); got != "v2\n" {
					t.Fatalf("%s on %s: got %q, want the rebuilt environment", sb.Name, sb.Spec.NodeName, got)
				}
				break
			}
			if i > holder.Slots {
				t.Fatalf("more sandboxes placed on %s than its %d slots", holder.Name, holder.Slots)
			}
		}
	})
}

// A node agent SIGKILLed while it runs an Environment's setup: started
// again, it does not run the steps a second time (they need not be
// repeatable) but reports the build Interrupted; the Environment says the
// build failed, and its builder is closed.
func TestEnvironmentSetupInterrupted(t *testing.T) {
	needNodes(t, 1)
	ctx := context.Background()
	ns := testNamespace(t)
	keepRunning(t)
	e := &fbv1.Environment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "slow"},
		Spec: fbv1.EnvironmentSpec{Image: env.image, Runtime: fbv1.RuntimeCrun, Setup: []string{"echo started > /root/started; sleep 600"}}}
	create(t, e)
	builder := &fbv1.Sandbox{}
	clustertest.Eventually(t, 2*time.Minute, "setup running", func() (bool, string) {
		get(t, e)
		if e.Status.Build == "" {
			return false, "no build yet"
		}
		builder.Namespace, builder.Name = ns, fbv1.BuilderName(e.Status.Build)
		if err := plane.Client.Get(ctx, client.ObjectKeyFromObject(builder), builder); err != nil {
			return false, err.Error()
		}
		c := condition(builder, fbv1.ConditionSetupComplete)
		return c != nil && c.Status == metav1.ConditionUnknown, fmt.Sprintf("%+v", c)
	})
	n := nodeNamed(builder.Spec.NodeName)
	if err := n.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	if err := n.Start(ctx); err != nil {
		t.Fatal(err)
	}
	clustertest.Eventually(t, 2*time.Minute, "build reported interrupted", func() (bool, string) {
		get(t, e)
		c := meta.FindStatusCondition(e.Status.Conditions, fbv1.ConditionBuilt)
		return c != nil && c.Status == metav1.ConditionFalse && c.Reason == controller.ReasonSetupFailed &&
			strings.Contains(c.Message, "stopped during the setup") && e.Status.Checkpoint == "", fmt.Sprintf("%+v", e.Status)
	})
	closedKept(t, builder)
}
