package cluster

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fbclient "github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/errdefs"
	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
)

// A closed sandbox behaves through the gateway as on one daemon (the
// SDKs' tests are the oracle): Get answers it closed (by ID and by name),
// List(all) includes it and List() does not, its ledger (on its node)
// has the exec and the close, its counters and any exec are
// FailedPrecondition, a second close is NotFound; nothing of it is left
// on its node, and its name is free for a new sandbox. A closed sandbox
// whose node is gone answers Events Unavailable, saying so.
func TestGatewayClosedSandbox(t *testing.T) {
	c := gateway(t)
	forEachRuntime(t, func(t *testing.T, rt fbv1.Runtime) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		name := "closed-" + string(rt)
		sb, err := c.CreateSandbox(ctx, fbclient.CreateOptions{Image: env.image, Name: name, Runtime: string(rt)})
		if err != nil {
			t.Fatal(err)
		}
		if got := gsh(t, sb, "echo hi"); got != "hi\n" {
			t.Fatalf("exec: got %q", got)
		}
		id := sb.ID
		if err := sb.Close(ctx); err != nil {
			t.Fatalf("close: %v", err)
		}
		obj := &fbv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: gw.namespace, Name: name}}
		closedKept(t, obj)
		if obj.Status.LocalID != id || obj.Status.ClosedAt == nil {
			t.Fatalf("closed object: local ID %q (want %s), closedAt %v", obj.Status.LocalID, id, obj.Status.ClosedAt)
		}

		for _, ref := range []string{id, name} {
			got, err := c.Sandbox(ctx, ref)
			if err != nil || got.ID != id || got.Info.State != "closed" || got.Info.Name != name {
				t.Fatalf("get %s after close: got %+v, %v; want %s closed", ref, got, err, id)
			}
		}
		listed := func(all bool) *fbclient.Info {
			t.Helper()
			l, err := c.ListSandboxes(ctx, all)
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range l {
				if s.Id == id {
					return s
				}
			}
			return nil
		}
		if s := listed(false); s != nil {
			t.Fatalf("list: got closed %s (%s), want only live ones", id, s.State)
		}
		if s := listed(true); s == nil || s.State != "closed" {
			t.Fatalf("list(all): got %+v, want %s closed", s, id)
		}

		evs, err := c.Events(ctx, name)
		if err != nil {
			t.Fatalf("events of the closed sandbox: %v", err)
		}
		var types []string
		for _, e := range evs {
			types = append(types, e.Type)
		}
		if len(types) == 0 || types[0] != "sandbox.created" || !slices.Contains(types, "exec.finished") || !slices.Contains(types, "sandbox.closed") {
			t.Fatalf("ledger of the closed sandbox: %v, want created, the exec, closed", types)
		}

		if _, err := sb.Metrics(ctx); !errdefs.IsFailedPrecondition(err) {
			t.Fatalf("metrics of a closed sandbox: got %v, want FailedPrecondition", err)
		}
		if _, err := sb.Exec(ctx, fbclient.ExecOptions{Shell: "true"}); !errdefs.IsFailedPrecondition(err) {
			t.Fatalf("exec in a closed sandbox: got %v, want FailedPrecondition", err)
		}
		if err := sb.Pause(ctx); !errdefs.IsFailedPrecondition(err) {
			t.Fatalf("pause of a closed sandbox: got %v, want FailedPrecondition", err)
		}
		if err := sb.Close(ctx); !errdefs.IsNotFound(err) {
			t.Fatalf("second close: got %v, want NotFound (already closed)", err)
		}

		// Its name is free again, as on one host.
		again, err := c.CreateSandbox(ctx, fbclient.CreateOptions{Image: env.image, Name: name, Runtime: string(rt)})
		if err != nil {
			t.Fatalf("a new sandbox of a closed one's name: %v", err)
		}
		if again.ID == id || again.Info.State != "running" {
			t.Fatalf("new sandbox of the name: id %s state %s, want a new running one", again.ID, again.Info.State)
		}
		if err := again.Close(ctx); err != nil {
			t.Fatal(err)
		}
		closedKept(t, obj)
	})

	// The node of a closed sandbox is gone: its ledger cannot be read.
	ctx := context.Background()
	orphan := &fbv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: gw.namespace, Name: "orphan"},
		Spec: fbv1.SandboxSpec{Image: env.image, State: fbv1.StateClosed, NodeName: "no-such-node"}}
	if err := plane.Client.Create(ctx, orphan); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { plane.Client.Delete(context.Background(), orphan) })
	now := metav1.Now()
	patch := client.MergeFrom(orphan.DeepCopy())
	orphan.Status.Phase, orphan.Status.LocalID, orphan.Status.ClosedAt = fbv1.PhaseClosed, "sb-0a0a0a0a0a0a", &now
	if err := plane.Client.Status().Patch(ctx, orphan, patch); err != nil {
		t.Fatal(err)
	}
	waitFor(30*time.Second, func() error { _, err := c.Sandbox(ctx, "sb-0a0a0a0a0a0a"); return err })
	if got, err := c.Sandbox(ctx, "sb-0a0a0a0a0a0a"); err != nil || got.Info.State != "closed" {
		t.Fatalf("get of a closed sandbox of a gone node: %+v, %v; want it closed", got, err)
	}
	if _, err := c.Events(ctx, "orphan"); !errdefs.IsUnavailable(err) || !strings.Contains(err.Error(), "no-such-node") ||
		!strings.Contains(err.Error(), "gone") {
		t.Fatalf("events of a closed sandbox of a gone node: got %v, want Unavailable naming the node", err)
	}
}
