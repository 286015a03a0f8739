package cluster

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fbclient "github.com/forkbox/forkbox/client"
	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
	"github.com/forkbox/forkbox/internal/cluster/clustertest"
	"github.com/forkbox/forkbox/internal/cluster/kube"
)

var runtimes = []fbv1.Runtime{fbv1.RuntimeGVisor, fbv1.RuntimeCrun}

// forEachRuntime runs f once per runtime.
func forEachRuntime(t *testing.T, f func(t *testing.T, rt fbv1.Runtime)) {
	for _, rt := range runtimes {
		t.Run(string(rt), func(t *testing.T) { f(t, rt) })
	}
}

func namespace(t testing.TB) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "e2e-"}}
	if err := plane.Client.Create(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
	return ns.Name
}

func get[T client.Object](t testing.TB, o T) T {
	t.Helper()
	if err := plane.Client.Get(context.Background(), client.ObjectKeyFromObject(o), o); err != nil {
		t.Fatalf("get %s: %v", o.GetName(), err)
	}
	return o
}

// update re-reads o, applies change and writes it, again on a conflict: a
// node or the controller may write the object (its status) in between, as
// they may under a user's kubectl edit, which then asks again.
func update[T client.Object](t testing.TB, o T, change func(T)) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		change(get(t, o))
		return plane.Client.Update(context.Background(), o)
	})
	if err != nil {
		t.Fatalf("update %s: %v", o.GetName(), err)
	}
}

// running waits until sb is placed on a node of the cluster and in
// phase, and returns its local sandbox through that node's API.
func running(t testing.TB, sb *fbv1.Sandbox, phase fbv1.SandboxPhase) *fbclient.Sandbox {
	t.Helper()
	clustertest.Eventually(t, 2*time.Minute, "sandbox "+sb.Name+" "+string(phase), func() (bool, string) {
		get(t, sb)
		return nodeNamed(sb.Spec.NodeName) != nil && sb.Status.Phase == phase && sb.Status.LocalID != "",
			fmt.Sprintf("node %q, phase %q, message %q", sb.Spec.NodeName, sb.Status.Phase, sb.Status.Message)
	})
	return localOf(t, sb)
}

// localOf is sb's local sandbox, through the API of the node it is on.
func localOf(t testing.TB, sb *fbv1.Sandbox) *fbclient.Sandbox {
	t.Helper()
	n := nodeNamed(sb.Spec.NodeName)
	if n == nil {
		t.Fatalf("sandbox %s is on node %q, not one of the cluster's", sb.Name, sb.Spec.NodeName)
	}
	local, err := n.Client.Sandbox(context.Background(), sb.Status.LocalID)
	if err != nil {
		t.Fatalf("local sandbox %s on %s: %v", sb.Status.LocalID, n.Name, err)
	}
	return local
}

func sh(t testing.TB, sb *fbclient.Sandbox, cmd string) string {
	t.Helper()
	var out, errb strings.Builder
	res, err := sb.Exec(context.Background(), fbclient.ExecOptions{Shell: cmd, Stdout: &out, Stderr: &errb})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("exec %q: %v (exit %v, stderr %q)", cmd, err, res, errb.String())
	}
	return out.String()
}

// A Sandbox object is placed on the node, run by its agent through the
// real daemon, driven through pause and back, forked through a Fork
// object, and closed when deleted.
func TestSandboxObjectLifecycle(t *testing.T) {
	need(t)
	forEachRuntime(t, func(t *testing.T, rt fbv1.Runtime) {
		ctx := context.Background()
		ns := namespace(t)
		sb := &fbv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "box"},
			Spec: fbv1.SandboxSpec{Image: env.image, Runtime: rt, Env: []fbv1.EnvVar{{Name: "GREETING", Value: "hello from kube"}}}}
		if err := plane.Client.Create(ctx, sb); err != nil {
			t.Fatal(err)
		}
		local := running(t, sb, fbv1.PhaseRunning)
		if got := sh(t, local, `echo "$GREETING"`); got != "hello from kube\n" {
			t.Fatalf("exec: got %q, want the object's env", got)
		}
		if sb.Status.IP == "" || !kube.IsTrue(sb.Status.Conditions, fbv1.ConditionReady) || local.Info.Name != kube.LocalSandboxName(sb) {
			t.Fatalf("got status %+v, local name %q", sb.Status, local.Info.Name)
		}
		var evs corev1.EventList
		clustertest.Eventually(t, 30*time.Second, "Scheduled and Created events", func() (bool, string) {
			if err := plane.Client.List(ctx, &evs, client.InNamespace(ns)); err != nil {
				return false, err.Error()
			}
			seen := map[string]bool{}
			for _, e := range evs.Items {
				if e.InvolvedObject.Name == "box" {
					seen[e.Reason] = true
				}
			}
			return seen["Scheduled"] && seen["Created"], fmt.Sprint(seen)
		})

		// Paused, then Running again.
		update(t, sb, func(sb *fbv1.Sandbox) { sb.Spec.State = fbv1.StatePaused })
		running(t, sb, fbv1.PhasePaused)
		if l, err := nodeNamed(sb.Spec.NodeName).Client.Sandbox(ctx, sb.Status.LocalID); err != nil || l.Info.State != "paused" {
			t.Fatalf("local state: got %v, %v; want paused", l, err)
		}
		update(t, sb, func(sb *fbv1.Sandbox) { sb.Spec.State = fbv1.StateRunning })
		local = running(t, sb, fbv1.PhaseRunning)

		// A Fork of it: a Checkpoint on this node and two children that
		// start from it, each with the parent's file and its own writes.
		sh(t, local, "echo parent-data > /root/marker")
		fk := &fbv1.Fork{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "fk"},
			Spec: fbv1.ForkSpec{Source: fbv1.ForkSource{Sandbox: "box"}, Count: 2}}
		if err := plane.Client.Create(ctx, fk); err != nil {
			t.Fatal(err)
		}
		for i := range 2 {
			child := &fbv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("fk-%d", i)}}
			clustertest.Eventually(t, 30*time.Second, "child "+child.Name, func() (bool, string) {
				err := plane.Client.Get(ctx, client.ObjectKeyFromObject(child), child)
				return err == nil, fmt.Sprint(err, " fork: ", get(t, fk).Status.Message)
			})
			cl := running(t, child, fbv1.PhaseRunning)
			if got := sh(t, cl, "cat /root/marker; echo child > /root/marker"); got != "parent-data\n" {
				t.Fatalf("child %d: got %q, want the parent's file", i, got)
			}
		}
		if got := sh(t, local, "cat /root/marker"); got != "parent-data\n" {
			t.Fatalf("parent after the children wrote: got %q", got)
		}
		clustertest.Eventually(t, 30*time.Second, "fork complete", func() (bool, string) {
			get(t, fk)
			return fk.Status.Phase == fbv1.ForkComplete && fk.Status.Ready == 2, fmt.Sprintf("%+v", fk.Status)
		})
		ck := get(t, &fbv1.Checkpoint{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "fk"}})
		if ck.Status.OriginNode != sb.Spec.NodeName || !ck.ReadyOn(sb.Spec.NodeName) || ck.Status.Kind == "" {
			t.Fatalf("got checkpoint status %+v", ck.Status)
		}

		// Deleting the objects closes the local sandboxes.
		ids := []string{sb.Status.LocalID}
		for i := range 2 {
			c := get(t, &fbv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("fk-%d", i)}})
			ids = append(ids, c.Status.LocalID)
			if err := plane.Client.Delete(ctx, c); err != nil {
				t.Fatal(err)
			}
		}
		if err := plane.Client.Delete(ctx, sb); err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{"box", "fk-0", "fk-1"} {
			o := &fbv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
			clustertest.Eventually(t, time.Minute, "sandbox "+name+" gone", func() (bool, string) {
				err := plane.Client.Get(ctx, client.ObjectKeyFromObject(o), o)
				return errors.IsNotFound(err), fmt.Sprint(err, o.Finalizers)
			})
		}
		for _, id := range ids {
			if l, err := nodeNamed(sb.Spec.NodeName).Client.Sandbox(ctx, id); err == nil && l.Info.State != "closed" {
				t.Fatalf("local sandbox %s: got state %s after its object was deleted, want closed", id, l.Info.State)
			}
		}
		if err := plane.Client.Delete(ctx, ck); err != nil {
			t.Fatal(err)
		}
		clustertest.Eventually(t, time.Minute, "checkpoint gone", func() (bool, string) {
			err := plane.Client.Get(ctx, client.ObjectKeyFromObject(ck), ck)
			return errors.IsNotFound(err), fmt.Sprint(err, ck.Finalizers)
		})
	})
}
