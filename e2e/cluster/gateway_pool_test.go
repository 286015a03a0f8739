package cluster

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fbclient "github.com/forkbox/forkbox/client"
	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
	"github.com/forkbox/forkbox/internal/cluster/clustertest"
)

// gwPool lists the gateway namespace's Sandboxes in env's warm pool (not
// being deleted), by object name.
func gwPool(t *testing.T, env string) map[string]*fbv1.Sandbox {
	t.Helper()
	var l fbv1.SandboxList
	if err := plane.Client.List(context.Background(), &l, client.InNamespace(gw.namespace), client.MatchingLabels{fbv1.PoolLabel: env}); err != nil {
		t.Fatal(err)
	}
	out := map[string]*fbv1.Sandbox{}
	for i := range l.Items {
		if l.Items[i].DeletionTimestamp.IsZero() {
			out[l.Items[i].Name] = &l.Items[i]
		}
	}
	return out
}

// awaitPoolReady waits until the environment says n of its pool are
// ready (as the SDK tests wait) and the Environment object agrees, and
// returns the pool's members then.
func awaitPoolReady(t *testing.T, c *fbclient.Client, name string, n int32) map[string]*fbv1.Sandbox {
	t.Helper()
	clustertest.Eventually(t, 3*time.Minute, fmt.Sprintf("pool of %s: %d ready", name, n), func() (bool, string) {
		info, err := c.GetEnvironment(context.Background(), name)
		if err != nil {
			return false, err.Error()
		}
		obj := get(t, &fbv1.Environment{ObjectMeta: metav1.ObjectMeta{Namespace: gw.namespace, Name: name}})
		var says []string
		for _, m := range gwPool(t, name) {
			says = append(says, fmt.Sprintf("%s: %s on %q %s", m.Name, m.Status.Phase, m.Spec.NodeName, m.Status.Message))
		}
		return info.PoolReady == n && obj.Status.PoolReady == n,
			fmt.Sprintf("gateway says %d, object %d; members %v", info.PoolReady, obj.Status.PoolReady, says)
	})
	return gwPool(t, name)
}

// handedOver checks that a sandbox an environment handed over from its
// pool is one of members (when given), a member of checkpoint ck taken
// out of the pool (no pool label, no owner), and runs what the setup
// made, with nothing of anyone before.
func handedOver(t *testing.T, sb *fbclient.EnvSandbox, ck string, members map[string]*fbv1.Sandbox) {
	t.Helper()
	if !sb.FromPool {
		t.Fatalf("sandbox %s (%s): from_pool false with a pool ready", sb.ID, sb.Info.Name)
	}
	if _, ok := members[sb.Info.Name]; !ok && members != nil {
		t.Fatalf("handed over %s, not one of the pool's members %v", sb.Info.Name, slices.Collect(maps.Keys(members)))
	}
	obj := get(t, &fbv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: gw.namespace, Name: sb.Info.Name}})
	if obj.Labels[fbv1.PoolLabel] != "" || len(obj.OwnerReferences) != 0 || obj.Annotations[fbv1.HandedOverAnnotation] == "" ||
		obj.Spec.Source == nil || obj.Spec.Source.Checkpoint != ck ||
		obj.Status.LocalID != sb.ID || sb.Info.State != "running" || !strings.HasPrefix(sb.Info.FromCheckpoint, "ck-") {
		t.Fatalf("handed-over %s: labels %v owners %v annotations %v local %q; answered %v", obj.Name, obj.Labels, obj.OwnerReferences,
			obj.Annotations, obj.Status.LocalID, sb.Info)
	}
	if out := gsh(t, sb.Sandbox, "cat /root/p; ls /root"); out != "pooled\np\n" {
		t.Fatalf("handed-over %s sees %q, want only the setup's file", sb.Info.Name, out)
	}
}

// A warm pool in cluster mode, as the SDKs see it on one host: an
// environment of pool size 2 keeps two Sandboxes of its checkpoint
// running (the environment's pool_ready says so, and so does the
// object); two handovers are those two, taken out of the pool (from_pool,
// no pool label, no owner), and see the setup's file and nothing of
// another caller; the pool refills with new members; concurrent
// handovers get distinct sandboxes (both ready members among them); the
// same definition with a smaller pool builds nothing and shrinks it;
// deleting the environment deletes its pool before
// the call returns, and the handed-over sandboxes run on.
func TestGatewayWarmPool(t *testing.T) {
	c := gateway(t)
	forEachRuntime(t, func(t *testing.T, rt fbv1.Runtime) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		name := "gpool-" + string(rt)
		t.Cleanup(func() { cleanEnvironments(t, name) })
		opts := fbclient.EnvironmentOptions{Image: env.image, Runtime: string(rt), Resources: fbclient.Resources{Memory: "256Mi"},
			PoolSize: 2, Setup: []*fbclient.SetupStep{fbclient.Run("echo pooled > /root/p")}}
		e := c.Environment(name, opts)
		info, err := e.Build(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if info.Definition.PoolSize != 2 {
			t.Fatalf("built: definition's pool size %d, want 2", info.Definition.PoolSize)
		}
		obj := get(t, &fbv1.Environment{ObjectMeta: metav1.ObjectMeta{Namespace: gw.namespace, Name: name}})
		members := awaitPoolReady(t, c, name, 2)
		ck := get(t, &fbv1.Checkpoint{ObjectMeta: metav1.ObjectMeta{Namespace: gw.namespace, Name: obj.Status.Checkpoint}})
		for _, m := range members {
			if !metav1.IsControlledBy(m, obj) || m.Spec.Source == nil || m.Spec.Source.Checkpoint != ck.Name || !ck.ReadyOn(m.Spec.NodeName) {
				t.Fatalf("pool member %s: owners %v source %+v on %s; want the environment's, from %s, on a node that holds it",
					m.Name, m.OwnerReferences, m.Spec.Source, m.Spec.NodeName, ck.Name)
			}
		}

		// Two handovers: the two members.
		var mine []*fbclient.EnvSandbox
		defer func() {
			for _, sb := range mine {
				sb.Close(context.Background())
			}
		}()
		for range 2 {
			sb, err := e.Sandbox(ctx, fbclient.Overrides{})
			if err != nil {
				t.Fatal(err)
			}
			mine = append(mine, sb)
			handedOver(t, sb, ck.Name, members)
			gsh(t, sb.Sandbox, "echo tenant > /root/mine")
		}
		if mine[0].Info.Name == mine[1].Info.Name {
			t.Fatalf("two handovers got the same sandbox %s", mine[0].Info.Name)
		}

		// The pool refills, with new members.
		refilled := awaitPoolReady(t, c, name, 2)
		for _, sb := range mine {
			if _, ok := refilled[sb.Info.Name]; ok {
				t.Fatalf("handed-over %s is in the pool again", sb.Info.Name)
			}
		}
		for _, sb := range mine {
			if err := sb.Close(ctx); err != nil {
				t.Fatal(err)
			}
		}
		mine = nil

		// Concurrent handovers: distinct sandboxes; the two ready members
		// go to two of them; the third gets a refill if one got ready in
		// time, else a fresh sandbox.
		got := make([]*fbclient.EnvSandbox, 3)
		errs := make([]error, 3)
		var wg sync.WaitGroup
		for i := range got {
			wg.Go(func() { got[i], errs[i] = e.Sandbox(ctx, fbclient.Overrides{}) })
		}
		wg.Wait()
		seen := map[string]bool{}
		pooled := 0
		for i, sb := range got {
			if errs[i] != nil {
				t.Fatalf("concurrent handover %d: %v", i, errs[i])
			}
			mine = append(mine, sb)
			if seen[sb.ID] || seen[sb.Info.Name] {
				t.Fatalf("two concurrent handovers got the same sandbox %s (%s)", sb.ID, sb.Info.Name)
			}
			seen[sb.ID], seen[sb.Info.Name] = true, true
			if sb.FromPool {
				handedOver(t, sb, ck.Name, nil)
				if _, ok := refilled[sb.Info.Name]; ok {
					pooled++
				}
			} else if _, ok := refilled[sb.Info.Name]; ok || gsh(t, sb.Sandbox, "cat /root/p") != "pooled\n" {
				t.Fatalf("fresh handover %s: a pool member's name, or not from the checkpoint", sb.Info.Name)
			}
		}
		if pooled != 2 {
			t.Fatalf("%d of the pool's 2 ready members were handed over to 3 concurrent callers, want both", pooled)
		}

		// The same definition with a pool of 1: nothing is built again, and
		// the pool shrinks.
		awaitPoolReady(t, c, name, 2)
		opts.PoolSize = 1
		var phases []string
		again, err := c.Environment(name, opts).Build(ctx, func(p *fbclient.BuildProgress) { phases = append(phases, p.Phase) })
		if err != nil || again.Hash != info.Hash || again.Checkpoint != info.Checkpoint || len(phases) == 0 || phases[0] != "cached" ||
			again.Definition.PoolSize != 1 {
			t.Fatalf("pool of 1: %v, %v, progress %v; want the same build, cached", again, err, phases)
		}
		awaitPoolReady(t, c, name, 1)
		clustertest.Eventually(t, 2*time.Minute, "pool of 1 member", func() (bool, string) {
			n := len(gwPool(t, name))
			return n == 1, fmt.Sprint(n, " members")
		})

		// Deleted: the pool goes before the call returns; what was handed
		// over runs on.
		pool := gwPool(t, name)
		if err := c.DeleteEnvironment(ctx, name); err != nil {
			t.Fatal(err)
		}
		live, err := c.ListSandboxes(ctx, false)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range live {
			if _, ok := pool[s.Name]; ok {
				t.Fatalf("pool member %s listed live after its environment was deleted", s.Name)
			}
		}
		for _, m := range pool {
			gone(t, m)
		}
		for _, sb := range mine {
			if out := gsh(t, sb.Sandbox, "cat /root/p"); out != "pooled\n" {
				t.Fatalf("handed-over %s after its environment was deleted: %q", sb.Info.Name, out)
			}
		}
	})
}
