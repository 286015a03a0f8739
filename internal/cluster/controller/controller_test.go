package controller

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
	"github.com/forkbox/forkbox/internal/cluster/clustertest"
)

const long = time.Hour // a lease that does not lapse during a test

func sandbox(ns, name string, mod ...func(*fbv1.Sandbox)) *fbv1.Sandbox {
	sb := &fbv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: fbv1.SandboxSpec{Image: "busybox"}}
	for _, m := range mod {
		m(sb)
	}
	return sb
}

func fromCheckpoint(ck string) func(*fbv1.Sandbox) {
	return func(sb *fbv1.Sandbox) { sb.Spec.Image, sb.Spec.Source = "", &fbv1.SandboxSource{Checkpoint: ck} }
}

// placedOn waits until sb is bound and returns its node.
func placedOn(t *testing.T, sb *fbv1.Sandbox) string {
	t.Helper()
	clustertest.Eventually(t, 30*time.Second, "sandbox "+sb.Name+" placed", func() (bool, string) {
		get(t, sb)
		return sb.Spec.NodeName != "", fmt.Sprintf("phase %q, message %q", sb.Status.Phase, sb.Status.Message)
	})
	return sb.Spec.NodeName
}

// unschedulable waits until sb is reported unschedulable with want in
// the message, and checks that it stays unbound.
func unschedulable(t *testing.T, sb *fbv1.Sandbox, want string) {
	t.Helper()
	clustertest.Eventually(t, 30*time.Second, "sandbox "+sb.Name+" unschedulable", func() (bool, string) {
		get(t, sb)
		c := meta.FindStatusCondition(sb.Status.Conditions, fbv1.ConditionScheduled)
		return c != nil && c.Status == metav1.ConditionFalse && strings.Contains(c.Message, want),
			fmt.Sprintf("node %q, conditions %+v", sb.Spec.NodeName, sb.Status.Conditions)
	})
	if sb.Spec.NodeName != "" {
		t.Fatalf("got it bound to %s", sb.Spec.NodeName)
	}
}

func TestPlacement(t *testing.T) {
	plane.Need(t)
	startController(t)
	ns := namespace(t)
	node(t, "pl-empty", 10, long)
	node(t, "pl-holder", 2, long)
	node(t, "pl-images", 10, long, func(n *fbv1.ForkboxNode) { n.Status.Images = []string{"python:3"} })
	node(t, "pl-crun", 10, long, func(n *fbv1.ForkboxNode) { n.Status.Runtimes = []fbv1.RuntimeInfo{{Name: fbv1.RuntimeCrun}} })
	ck := &fbv1.Checkpoint{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "ck"}, Spec: fbv1.CheckpointSpec{Sandbox: "gone", NodeName: "pl-holder"}}
	create(t, ck)
	setReady(t, ck, "pl-holder")

	// The checkpoint's node wins over emptier ones.
	a := sandbox(ns, "from-ck-1", fromCheckpoint("ck"))
	create(t, a)
	if got := placedOn(t, a); got != "pl-holder" {
		t.Fatalf("from checkpoint: got %s, want pl-holder", got)
	}
	// A cached image wins over load; gvisor excludes the crun-only node.
	b := sandbox(ns, "python", func(sb *fbv1.Sandbox) { sb.Spec.Image = "python:3"; sb.Spec.Runtime = fbv1.RuntimeGVisor })
	create(t, b)
	if got := placedOn(t, b); got != "pl-images" {
		t.Fatalf("image cached: got %s, want pl-images", got)
	}
	// The holder has one slot left: the next child takes it, and the one
	// after cannot go anywhere (no cross-node transfer yet).
	c := sandbox(ns, "from-ck-2", fromCheckpoint("ck"))
	create(t, c)
	if got := placedOn(t, c); got != "pl-holder" {
		t.Fatalf("second from checkpoint: got %s, want pl-holder", got)
	}
	d := sandbox(ns, "from-ck-3", fromCheckpoint("ck"))
	create(t, d)
	unschedulable(t, d, "checkpoint ck not on any node with room")

	// A sandbox waiting for its checkpoint is placed once it is ready.
	e := sandbox(ns, "waits", fromCheckpoint("later"))
	create(t, e)
	unschedulable(t, e, "checkpoint later does not exist")
	later := &fbv1.Checkpoint{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "later"}, Spec: fbv1.CheckpointSpec{Sandbox: "gone", NodeName: "pl-empty"}}
	create(t, later)
	setReady(t, later, "pl-empty")
	if got := placedOn(t, e); got != "pl-empty" {
		t.Fatalf("after its checkpoint became ready: got %s, want pl-empty", got)
	}
}

// A Fork of a running sandbox becomes a Checkpoint on the source's node,
// then Count children that fill that node; the rest are reported
// unschedulable (cross-node transfer comes with issue 15).
func TestForkFanOut(t *testing.T) {
	plane.Need(t)
	startController(t)
	ns := namespace(t)
	node(t, "fk-src", 4, long)
	node(t, "fk-other", 10, long)
	ref := func(name string) fbv1.SecretKeyRef { return fbv1.SecretKeyRef{Name: name, Key: "value"} }
	src := sandbox(ns, "src", func(sb *fbv1.Sandbox) {
		sb.Spec.NodeName = "fk-src"
		sb.Spec.Credentials = []fbv1.Credential{{Name: "API_KEY", SecretRef: ref("s1")},
			{Name: "token", File: "token", PerFork: true, SecretRef: ref("s2")}, {Name: "OTHER", SecretRef: ref("s3")}}
	})
	create(t, src)
	setPhase(t, src, fbv1.PhaseRunning)
	// Children inherit the source's credentials but the per-fork one; the
	// Fork's replace those of the same name.
	fk := &fbv1.Fork{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "fan"},
		Spec: fbv1.ForkSpec{Source: fbv1.ForkSource{Sandbox: "src"}, Count: 5,
			Overrides: fbv1.ForkOverrides{Env: []fbv1.EnvVar{{Name: "CHILD", Value: "1"}},
				Credentials: []fbv1.Credential{{Name: "OTHER", SecretRef: ref("s4")}}}}}
	wantCreds := []fbv1.Credential{{Name: "API_KEY", SecretRef: ref("s1")}, {Name: "OTHER", SecretRef: ref("s4")}}
	create(t, fk)

	ck := &fbv1.Checkpoint{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "fan"}}
	clustertest.Eventually(t, 30*time.Second, "the fork's checkpoint", func() (bool, string) {
		err := plane.Client.Get(context.Background(), client.ObjectKeyFromObject(ck), ck)
		return err == nil, fmt.Sprint(err)
	})
	if ck.Spec.Sandbox != "src" || ck.Spec.NodeName != "fk-src" || !metav1.IsControlledBy(ck, get(t, fk)) {
		t.Fatalf("got checkpoint spec %+v, owners %+v; want of src on fk-src, owned by the fork", ck.Spec, ck.OwnerReferences)
	}
	clustertest.Eventually(t, 30*time.Second, "fork Checkpointing before its checkpoint is ready", func() (bool, string) {
		get(t, fk)
		return fk.Status.Phase == fbv1.ForkCheckpointing, string(fk.Status.Phase)
	})
	setReady(t, ck, "fk-src")

	var children []*fbv1.Sandbox
	for i := range 5 {
		sb := &fbv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("fan-%d", i)}}
		clustertest.Eventually(t, 30*time.Second, "child "+sb.Name, func() (bool, string) {
			err := plane.Client.Get(context.Background(), client.ObjectKeyFromObject(sb), sb)
			return err == nil, fmt.Sprint(err)
		})
		if !metav1.IsControlledBy(sb, fk) || sb.Labels[fbv1.ForkLabel] != "fan" || sb.Spec.Source == nil ||
			sb.Spec.Source.Checkpoint != "fan" || len(sb.Spec.Env) != 1 || sb.Spec.Env[0].Name != "CHILD" ||
			!reflect.DeepEqual(sb.Spec.Credentials, wantCreds) {
			t.Fatalf("child %s: got %+v, owners %+v", sb.Name, sb.Spec, sb.OwnerReferences)
		}
		children = append(children, sb)
	}
	// The source holds one of fk-src's 4 slots: 3 children fit there.
	onSrc := 0
	clustertest.Eventually(t, 30*time.Second, "children placed or refused", func() (bool, string) {
		onSrc = 0
		settled := 0
		for _, sb := range children {
			get(t, sb)
			c := meta.FindStatusCondition(sb.Status.Conditions, fbv1.ConditionScheduled)
			switch {
			case sb.Spec.NodeName == "fk-src":
				onSrc++
				settled++
			case sb.Spec.NodeName != "":
				t.Fatalf("child %s placed on %s: the checkpoint is not there", sb.Name, sb.Spec.NodeName)
			case c != nil && strings.Contains(c.Message, "checkpoint fan not on any node with room"):
				settled++
			}
		}
		return settled == 5, fmt.Sprintf("%d settled, %d on fk-src", settled, onSrc)
	})
	if onSrc != 3 {
		t.Fatalf("got %d children on fk-src, want 3", onSrc)
	}
	clustertest.Eventually(t, 30*time.Second, "fork status", func() (bool, string) {
		get(t, fk)
		nodes := 0
		for _, c := range fk.Status.Children {
			if c.Node == "fk-src" {
				nodes++
			}
		}
		return fk.Status.Checkpoint == "fan" && len(fk.Status.Children) == 5 && nodes == 3,
			fmt.Sprintf("%+v", fk.Status)
	})
}

// A node whose Lease lapses is NotReady; its sandboxes are reported Lost
// (not recreated), a closed one stays Closed, and it gets no new
// placements. The Lease is for an hour, and lapses once its sandboxes are
// set up, by moving its renewal back past that.
func TestLeaseExpiry(t *testing.T) {
	plane.Need(t)
	startController(t)
	ns := namespace(t)
	n := node(t, "ls-dying", 10, long)
	sb := sandbox(ns, "on-dying", func(sb *fbv1.Sandbox) { sb.Spec.NodeName = "ls-dying" })
	create(t, sb)
	setPhase(t, sb, fbv1.PhaseRunning)
	done := sandbox(ns, "closed-on-dying", func(sb *fbv1.Sandbox) { sb.Spec.NodeName, sb.Spec.State = "ls-dying", fbv1.StateClosed })
	create(t, done)
	updateStatus(t, done, func(sb *fbv1.Sandbox) {
		now := metav1.Now()
		sb.Status.Phase, sb.Status.ClosedAt = fbv1.PhaseClosed, &now
	})
	update(t, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: clustertest.Namespace, Name: "ls-dying"}}, func(l *coordinationv1.Lease) {
		l.Spec.RenewTime = &metav1.MicroTime{Time: time.Now().Add(-long - time.Minute)}
	})
	clustertest.Eventually(t, 30*time.Second, "node NotReady", func() (bool, string) {
		get(t, n)
		c := meta.FindStatusCondition(n.Status.Conditions, fbv1.ConditionReady)
		return c != nil && c.Status == metav1.ConditionFalse && c.Reason == ReasonLeaseExpired, fmt.Sprintf("%+v", c)
	})
	clustertest.Eventually(t, 30*time.Second, "sandbox Lost", func() (bool, string) {
		get(t, sb)
		return sb.Status.Phase == fbv1.PhaseLost && strings.Contains(sb.Status.Message, "ls-dying"), string(sb.Status.Phase)
	})
	if sb.Spec.NodeName != "ls-dying" {
		t.Fatalf("got the lost sandbox moved to %q", sb.Spec.NodeName)
	}
	if got := get(t, done).Status.Phase; got != fbv1.PhaseClosed {
		t.Fatalf("a closed sandbox of the lost node: phase %s, want it Closed", got)
	}
	fresh := sandbox(ns, "fresh")
	create(t, fresh)
	unschedulable(t, fresh, "ls-dying: not ready")
}

// A Checkpoint records the checkpoint its sandbox started from as its
// spec.parent (what grants trust as descent; no node writes it): a
// Fork's from its creation, one created bare with its node.
func TestCheckpointRecordsParent(t *testing.T) {
	plane.Need(t)
	startController(t)
	ns := namespace(t)
	node(t, "par-node", 4, long)
	child := sandbox(ns, "child", fromCheckpoint("base"), func(sb *fbv1.Sandbox) { sb.Spec.NodeName = "par-node" })
	create(t, child)
	setPhase(t, child, fbv1.PhaseRunning)
	bare := &fbv1.Checkpoint{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "bare"}, Spec: fbv1.CheckpointSpec{Sandbox: "child"}}
	create(t, bare)
	clustertest.Eventually(t, 30*time.Second, "the bare checkpoint's node and parent", func() (bool, string) {
		get(t, bare)
		return bare.Spec.NodeName == "par-node" && bare.Spec.Parent == "base", fmt.Sprintf("%+v", bare.Spec)
	})
	create(t, &fbv1.Fork{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "fk"},
		Spec: fbv1.ForkSpec{Source: fbv1.ForkSource{Sandbox: "child"}, Count: 1}})
	ck := &fbv1.Checkpoint{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "fk"}}
	clustertest.Eventually(t, 30*time.Second, "the fork's checkpoint", func() (bool, string) {
		err := plane.Client.Get(context.Background(), client.ObjectKeyFromObject(ck), ck)
		return err == nil, fmt.Sprint(err)
	})
	if ck.Spec.Parent != "base" || ck.Spec.NodeName != "par-node" {
		t.Fatalf("the fork's checkpoint: got spec %+v, want parent base on par-node", ck.Spec)
	}
}
