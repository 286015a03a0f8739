package cluster

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
	"github.com/forkbox/forkbox/internal/cluster/clustertest"
	"github.com/forkbox/forkbox/internal/cluster/kube"
)

// A node agent SIGKILLed and started again reconciles its Sandboxes: a
// running one stays running with the same local sandbox, processes,
// files and address, and its status is right; a Sandbox created for the
// node while it was down is created after; one deleted while it was down
// is closed, with nothing of it left on the host.
func TestAgentKilledReconciles(t *testing.T) {
	needNodes(t, 2)
	forEachRuntime(t, func(t *testing.T, rt fbv1.Runtime) {
		ctx := context.Background()
		ns := testNamespace(t)
		keepRunning(t)
		n := node(1)
		keep, doomed := newSandbox(ns, "keep", n.Name, rt), newSandbox(ns, "doomed", n.Name, rt)
		create(t, keep)
		create(t, doomed)
		lk := running(t, keep, fbv1.PhaseRunning)
		ld := running(t, doomed, fbv1.PhaseRunning)
		sh(t, lk, "echo before > /root/state")
		pids := n.SandboxPids(lk.ID)
		if len(pids) == 0 {
			t.Fatalf("no processes in the cgroup of %s", lk.ID)
		}
		ip, localID := keep.Status.IP, keep.Status.LocalID

		if err := n.Kill(ctx); err != nil {
			t.Fatal(err)
		}
		// While it is down: one Sandbox is deleted, one created for it.
		if err := plane.Client.Delete(ctx, doomed); err != nil {
			t.Fatal(err)
		}
		late := newSandbox(ns, "late", n.Name, rt)
		create(t, late)
		if got := get(t, doomed); !slices.Contains(got.Finalizers, fbv1.SandboxFinalizer) {
			t.Fatalf("doomed lost its finalizer while its node was down: %v", got.Finalizers)
		}
		if got := n.SandboxPids(lk.ID); !slices.Equal(got, pids) {
			t.Fatalf("processes of %s with the agent down: got %v, want %v", lk.ID, got, pids)
		}

		if err := n.Start(ctx); err != nil {
			t.Fatal(err)
		}
		gone(t, doomed)
		if l, err := n.Client.Sandbox(ctx, ld.ID); err == nil && l.Info.State != "closed" {
			t.Fatalf("local sandbox of the deleted Sandbox: state %s, want closed", l.Info.State)
		}
		clustertest.Eventually(t, time.Minute, "nothing of "+ld.ID+" left", func() (bool, string) {
			l := n.Leftovers(ld.ID)
			return len(l) == 0, strings.Join(l, "\n")
		})
		running(t, late, fbv1.PhaseRunning)
		if late.Spec.NodeName != n.Name {
			t.Fatalf("late is on %s, want %s", late.Spec.NodeName, n.Name)
		}

		// The running one: the same local sandbox, processes, file, address.
		clustertest.Eventually(t, time.Minute, "keep Ready after the restart", func() (bool, string) {
			get(t, keep)
			c := meta.FindStatusCondition(keep.Status.Conditions, fbv1.ConditionReady)
			return keep.Status.Phase == fbv1.PhaseRunning && c != nil && c.Status == "True", fmt.Sprintf("%+v", keep.Status)
		})
		if keep.Status.LocalID != localID || keep.Status.IP != ip || keep.Status.Endpoint != n.Endpoint {
			t.Fatalf("status after restart: local %s, ip %s, endpoint %s; want %s, %s, %s",
				keep.Status.LocalID, keep.Status.IP, keep.Status.Endpoint, localID, ip, n.Endpoint)
		}
		lk = localOf(t, keep)
		if got := sh(t, lk, "cat /root/state"); got != "before\n" {
			t.Fatalf("file after restart: got %q", got)
		}
		if got := n.SandboxPids(lk.ID); !slices.Equal(got, pids) {
			t.Fatalf("processes of %s after restart: got %v, want %v (the same, not restarted)", lk.ID, got, pids)
		}
		if lk.Info.Name != kube.LocalSandboxName(keep) {
			t.Fatalf("local name %q, want %q", lk.Info.Name, kube.LocalSandboxName(keep))
		}
		// Exactly one local sandbox per object: nothing was made twice.
		list, err := n.Client.ListSandboxes(ctx, false)
		if err != nil {
			t.Fatal(err)
		}
		count := map[string]int{}
		for _, s := range list {
			count[s.Name]++
		}
		for _, o := range []client.Object{keep, late} {
			if c := count[kube.LocalSandboxName(o.(*fbv1.Sandbox))]; c != 1 {
				t.Fatalf("%d live local sandboxes for %s, want 1: %v", c, o.GetName(), count)
			}
		}
	})
}
