package controller

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
	"github.com/forkbox/forkbox/internal/cluster/clustertest"
)

// poolMembers lists the Sandboxes labelled members of e's pool, not being
// deleted, by name.
func poolMembers(t *testing.T, e *fbv1.Environment) map[string]*fbv1.Sandbox {
	t.Helper()
	var l fbv1.SandboxList
	if err := plane.Client.List(context.Background(), &l, client.InNamespace(e.Namespace), client.MatchingLabels{fbv1.PoolLabel: e.Name}); err != nil {
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

// awaitPool waits until e's pool is n members of checkpoint ck, each
// controlled by e and placed, and writes them running as their node's
// agent would; it returns them.
func awaitPool(t *testing.T, e *fbv1.Environment, n int, ck string) map[string]*fbv1.Sandbox {
	t.Helper()
	var got map[string]*fbv1.Sandbox
	clustertest.Eventually(t, 30*time.Second, fmt.Sprintf("pool of %d from %s", n, ck), func() (bool, string) {
		got = poolMembers(t, e)
		var says []string
		ok := len(got) == n
		for _, m := range got {
			ok = ok && metav1.IsControlledBy(m, get(t, e)) && m.Spec.Source != nil && m.Spec.Source.Checkpoint == ck && m.Spec.NodeName != ""
			says = append(says, fmt.Sprintf("%s: source %+v node %q owners %v", m.Name, m.Spec.Source, m.Spec.NodeName, m.OwnerReferences))
		}
		return ok, fmt.Sprint(says)
	})
	for _, m := range got {
		if m.Status.LocalID == "" {
			updateStatus(t, m, func(sb *fbv1.Sandbox) {
				sb.Status.Phase, sb.Status.LocalID = fbv1.PhaseRunning, "sb-"+sb.Name
			})
		}
	}
	clustertest.Eventually(t, 30*time.Second, fmt.Sprintf("status.poolReady %d", n), func() (bool, string) {
		return get(t, e).Status.PoolReady == int32(n), fmt.Sprint("poolReady ", e.Status.PoolReady)
	})
	return got
}

// claim takes m out of its pool as a handover does: its pool label and
// controller reference go in one write under an optimistic lock.
func claim(t *testing.T, m *fbv1.Sandbox) {
	t.Helper()
	patch := client.MergeFromWithOptions(m.DeepCopy(), client.MergeFromWithOptimisticLock{})
	delete(m.Labels, fbv1.PoolLabel)
	m.OwnerReferences = nil
	if err := plane.Client.Patch(context.Background(), m, patch); err != nil {
		t.Fatalf("claim %s: %v", m.Name, err)
	}
}

// An Environment's warm pool: poolSize Sandboxes of its checkpoint,
// placed where the checkpoint is and counted against the node's slots; a
// claimed one leaves the pool and is refilled (once there is room); a
// failed one is replaced; a rebuild replaces the members of the old
// checkpoint; a smaller size deletes the extra; deleting the environment
// deletes its pool but not what was handed over.
func TestEnvironmentPool(t *testing.T) {
	plane.Need(t)
	startController(t)
	ns := namespace(t)
	node(t, "pool-holder", 3, long)
	e := &fbv1.Environment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "warm"},
		Spec: fbv1.EnvironmentSpec{Image: "busybox", Runtime: fbv1.RuntimeCrun, Setup: []string{"echo w > /root/w"}, PoolSize: 2}}
	create(t, e)
	first := "warm-" + e.Spec.Hash()[:10] // the build, and the checkpoint it makes
	b := awaitBuilder(t, e, first)
	if n := len(poolMembers(t, e)); n != 0 {
		t.Fatalf("%d pool members before the first build", n)
	}
	setupDone(t, b, true, "1 step")
	awaitCapture(t, b, "pool-holder")
	holder := "pool-holder"
	awaitBuilt(t, e, first)
	closedObj(t, b)
	node(t, "pool-empty", 10, long) // emptier, but without the checkpoint

	// Two members, where the checkpoint is.
	pool := awaitPool(t, e, 2, first)
	for _, m := range pool {
		if m.Spec.NodeName != holder {
			t.Fatalf("pool member %s on %s, want %s (holds the checkpoint)", m.Name, m.Spec.NodeName, holder)
		}
	}

	// A handover takes one: the pool is refilled.
	var names []string
	for n := range pool {
		names = append(names, n)
	}
	slices.Sort(names)
	taken := pool[names[0]]
	claim(t, taken)
	refilled := awaitPool(t, e, 2, first)
	if _, ok := refilled[taken.Name]; ok {
		t.Fatalf("the claimed sandbox %s is still a pool member", taken.Name)
	}
	if got := get(t, taken); !got.DeletionTimestamp.IsZero() || len(got.OwnerReferences) != 0 {
		t.Fatalf("the claimed sandbox: deletion %v, owners %v; want it the caller's", got.DeletionTimestamp, got.OwnerReferences)
	}

	// The holder's 3 slots are full (2 members, 1 handed over): a second
	// handover's refill waits for room, and gets it when the first closes.
	second := refilled[names[1]]
	if second == nil {
		for _, m := range refilled {
			second = m
		}
	}
	claim(t, second)
	var waiting *fbv1.Sandbox
	clustertest.Eventually(t, 30*time.Second, "a refill waiting for room", func() (bool, string) {
		for _, m := range poolMembers(t, e) {
			if m.Spec.NodeName == "" {
				waiting = m
				return true, ""
			}
		}
		return false, fmt.Sprint(len(poolMembers(t, e)), " members, all placed")
	})
	unschedulable(t, waiting, "not on any node with room")
	if err := plane.Client.Delete(context.Background(), taken); err != nil {
		t.Fatal(err)
	}
	if got := placedOn(t, waiting); got != holder {
		t.Fatalf("refill placed on %s, want %s", got, holder)
	}
	if err := plane.Client.Delete(context.Background(), second); err != nil {
		t.Fatal(err)
	}
	pool = awaitPool(t, e, 2, first)

	// A member that fails is replaced (after the retry interval).
	var failed *fbv1.Sandbox
	for _, m := range pool {
		failed = m
	}
	updateStatus(t, failed, func(sb *fbv1.Sandbox) { sb.Status.Phase, sb.Status.Message = fbv1.PhaseFailed, "test: it broke" })
	goneObj(t, failed)
	pool = awaitPool(t, e, 2, first)

	// A member asked to stop (a caller paused it) is replaced too.
	var paused *fbv1.Sandbox
	for _, m := range pool {
		paused = m
		break
	}
	update(t, paused, func(sb *fbv1.Sandbox) { sb.Spec.State = fbv1.StatePaused })
	goneObj(t, paused)
	pool = awaitPool(t, e, 2, first)

	// A rebuild: the old checkpoint's members are replaced.
	update(t, e, func(e *fbv1.Environment) { e.Spec.Setup = append(e.Spec.Setup, "echo x > /root/x") })
	rebuilt := "warm-" + e.Spec.Hash()[:10]
	b2 := awaitBuilder(t, e, rebuilt)
	setupDone(t, b2, true, "2 steps")
	awaitCapture(t, b2, b2.Spec.NodeName)
	awaitBuilt(t, e, rebuilt)
	for _, m := range pool {
		goneObj(t, m)
	}
	pool = awaitPool(t, e, 2, rebuilt)

	// A smaller pool; then one handed over; then the environment goes:
	// its pool goes with it, the handed-over sandbox stays.
	update(t, e, func(e *fbv1.Environment) { e.Spec.PoolSize = 1 })
	if e.Spec.Hash() != e.Status.Hash {
		t.Fatalf("poolSize changed the spec's hash")
	}
	pool = awaitPool(t, e, 1, rebuilt)
	for _, m := range pool {
		taken = m
	}
	claim(t, taken)
	pool = awaitPool(t, e, 1, rebuilt)
	if err := plane.Client.Delete(context.Background(), e); err != nil {
		t.Fatal(err)
	}
	for _, m := range pool {
		goneObj(t, m)
	}
	if got := get(t, taken); !got.DeletionTimestamp.IsZero() {
		t.Fatalf("the handed-over sandbox %s is being deleted with its environment", got.Name)
	}
}
