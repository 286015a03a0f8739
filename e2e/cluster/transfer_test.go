package cluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
	"github.com/forkbox/forkbox/internal/cluster/clustertest"
)

// Cross-node forks (issue 15): a node pulls a checkpoint it lacks from a
// node holding it (package transfer), over the nodes' own network
// namespaces, with mutual TLS between their published certificates.

// newCheckpoint captures sandbox sb (memory too if memory) as Checkpoint
// name and waits until it is Ready.
func newCheckpoint(t testing.TB, ns, name, sb string, memory bool) *fbv1.Checkpoint {
	t.Helper()
	ck := &fbv1.Checkpoint{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: fbv1.CheckpointSpec{Sandbox: sb, Memory: memory}}
	create(t, ck)
	clustertest.Eventually(t, 2*time.Minute, "checkpoint "+name+" ready", func() (bool, string) {
		get(t, ck)
		return ck.Status.Phase == fbv1.CheckpointReady, fmt.Sprintf("%+v", ck.Status)
	})
	if ck.Status.SubvolumeUUID == "" {
		t.Fatalf("checkpoint %s has no subvolume UUID", name)
	}
	return ck
}

// fromCheckpoint is a Sandbox started from checkpoint ck on node (pinned;
// "" lets the placer choose).
func fromCheckpoint(ns, name, ck, node string) *fbv1.Sandbox {
	return &fbv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: fbv1.SandboxSpec{Source: &fbv1.SandboxSource{Checkpoint: ck}, NodeName: node}}
}

// replicaOn reports whether ck has a ready replica on node.
func replicaOn(t testing.TB, ck *fbv1.Checkpoint, node string) bool {
	return get(t, ck).ReadyOn(node)
}

var transferredRE = regexp.MustCompile(`pulled from node (\S+): (full|incremental from (\S+)), (\d+) bytes in (\d+) ms`)

// pullEvent is one Transferred event: a pull of a checkpoint.
type pullEvent struct {
	from, parent string
	bytes, ms    int64
}

// transfers are the Transferred events of ck: one per pull.
func transfers(t testing.TB, ck *fbv1.Checkpoint) []pullEvent {
	t.Helper()
	var evs corev1.EventList
	if err := plane.Client.List(context.Background(), &evs, client.InNamespace(ck.Namespace)); err != nil {
		t.Fatal(err)
	}
	var out []pullEvent
	for _, e := range evs.Items {
		if e.InvolvedObject.Name != ck.Name || e.Reason != "Transferred" {
			continue
		}
		m := transferredRE.FindStringSubmatch(e.Message)
		if m == nil {
			t.Fatalf("Transferred event %q", e.Message)
		}
		b, _ := strconv.ParseInt(m[4], 10, 64)
		ms, _ := strconv.ParseInt(m[5], 10, 64)
		out = append(out, pullEvent{from: m[1], parent: m[3], bytes: b, ms: ms})
	}
	return out
}

// waitTransfers waits until ck has n Transferred events.
func waitTransfers(t testing.TB, ck *fbv1.Checkpoint, n int) []pullEvent {
	t.Helper()
	var got []pullEvent
	clustertest.Eventually(t, time.Minute, fmt.Sprintf("%d transfers of %s", n, ck.Name), func() (bool, string) {
		got = transfers(t, ck)
		return len(got) >= n, fmt.Sprintf("%+v", got)
	})
	return got
}

// noHalfCheckpoint checks that node n's snapshot store holds only
// committed snapshots with metadata and no memory image being received.
func noHalfCheckpoint(t *testing.T, n *clustertest.Node) {
	t.Helper()
	dir := filepath.Join(n.StateDir, "snapshots")
	ents, _ := os.ReadDir(filepath.Join(dir, "committed"))
	for _, e := range ents {
		if _, err := os.Stat(filepath.Join(dir, "meta", e.Name()+".json")); err != nil {
			t.Errorf("node %s: committed/%s has no metadata: a half-received checkpoint", n.Name, e.Name())
		}
	}
	if m, _ := filepath.Glob(filepath.Join(n.StateDir, "memimages", ".recv-*")); len(m) > 0 {
		t.Errorf("node %s: memory images being received: %v", n.Name, m)
	}
}

// TestForkSpillsAndReuses: once the checkpoint's node is full, a fork's
// children go to the other nodes, whose agents pull the checkpoint
// (Transferring, then a ready replica each); the children run with the
// source's files. A second fork of that checkpoint lands on the replicas
// and pulls nothing.
func TestForkSpillsAndReuses(t *testing.T) {
	needNodes(t, 3)
	ns := testNamespace(t)
	src := node(len(nodes()) - 1)
	box := newSandbox(ns, "src", src.Name, fbv1.RuntimeCrun)
	create(t, box)
	local := running(t, box, fbv1.PhaseRunning)
	sh(t, local, "echo from-src > /root/marker && dd if=/dev/urandom of=/root/blob bs=1M count=20 2>/dev/null && md5sum /root/blob")
	sum := sh(t, local, "md5sum < /root/blob")

	// Slots - 1 children fill the source's node; two more spill.
	fill := fork(t, ns, "fill", "src", int32(src.Slots-1))
	for i := range src.Slots - 1 {
		running(t, child(t, fill, i), fbv1.PhaseRunning)
	}
	spill := fork(t, ns, "spill", "src", 2)
	targets := map[string]bool{}
	for i := range 2 {
		c := child(t, spill, i)
		l := running(t, c, fbv1.PhaseRunning)
		if c.Spec.NodeName == src.Name {
			t.Fatalf("child %s on the full node %s", c.Name, src.Name)
		}
		targets[c.Spec.NodeName] = true
		if got := sh(t, l, "cat /root/marker; md5sum < /root/blob"); got != "from-src\n"+sum {
			t.Fatalf("child %s on %s: got %q, want the source's files", c.Name, c.Spec.NodeName, got)
		}
	}
	ck := &fbv1.Checkpoint{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: get(t, spill).Status.Checkpoint}}
	for n := range targets {
		if !replicaOn(t, ck, n) {
			t.Fatalf("checkpoint %s has no ready replica on %s: %+v", ck.Name, n, ck.Status.Replicas)
		}
	}
	pulls := waitTransfers(t, ck, len(targets))
	for _, p := range pulls {
		t.Logf("pull of %s: %+v", ck.Name, p)
		if p.from != src.Name || p.parent != "" || p.bytes < 20<<20 {
			t.Errorf("pull %+v: want a full send of the 20 MiB from %s", p, src.Name)
		}
	}
	if c := findCondition(get(t, ck).Status.Conditions, fbv1.ConditionTransferring); c == nil || c.Status != "False" || c.Reason != "Transferred" {
		t.Errorf("Transferring condition of %s: got %+v, want False/Transferred", ck.Name, c)
	}
	clustertest.Eventually(t, time.Minute, "fork spill complete", func() (bool, string) {
		get(t, spill)
		return spill.Status.Phase == fbv1.ForkComplete && spill.Status.Ready == 2, fmt.Sprintf("%+v", spill.Status)
	})

	// A fork of the same checkpoint reuses the replicas.
	again := &fbv1.Fork{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "again"},
		Spec: fbv1.ForkSpec{Source: fbv1.ForkSource{Checkpoint: ck.Name}, Count: 2}}
	create(t, again)
	for i := range 2 {
		c := child(t, again, i)
		running(t, c, fbv1.PhaseRunning)
		if !targets[c.Spec.NodeName] {
			t.Errorf("child %s of the second fork on %s, want a node with a replica (%v)", c.Name, c.Spec.NodeName, targets)
		}
	}
	if got := transfers(t, ck); len(got) != len(pulls) {
		t.Errorf("the second fork pulled again: %+v", got)
	}
}

func findCondition(cs []metav1.Condition, typ string) *metav1.Condition {
	for i := range cs {
		if cs[i].Type == typ {
			return &cs[i]
		}
	}
	return nil
}

// TestTransferChainIncremental: a fork of a fork of a fork across the
// three nodes. Each pull is incremental from the nearest ancestor that
// both the receiver and the sender hold, full when there is none: x goes
// a→b full; y (b) goes to a from x, to c full; z (c) goes to a and b
// from y, carrying only what the last generation wrote.
func TestTransferChainIncremental(t *testing.T) {
	needNodes(t, 3)
	ns := testNamespace(t)
	a, b, c := node(0), node(1), node(2)
	start := func(name, ck, node, cmd string) *fbv1.Sandbox {
		var sb *fbv1.Sandbox
		if ck == "" {
			sb = newSandbox(ns, name, node, fbv1.RuntimeCrun)
		} else {
			sb = fromCheckpoint(ns, name, ck, node)
		}
		create(t, sb)
		l := running(t, sb, fbv1.PhaseRunning)
		if cmd != "" {
			sh(t, l, cmd)
		}
		return sb
	}
	start("s0", "", a.Name, "dd if=/dev/urandom of=/root/g0 bs=1M count=20 2>/dev/null")
	x := newCheckpoint(t, ns, "x", "s0", false)
	start("s1", "x", b.Name, "dd if=/dev/urandom of=/root/g1 bs=1M count=2 2>/dev/null")
	y := newCheckpoint(t, ns, "y", "s1", false)
	start("y-on-a", "y", a.Name, "")
	start("s2", "y", c.Name, "dd if=/dev/urandom of=/root/g2 bs=1M count=2 2>/dev/null")
	z := newCheckpoint(t, ns, "z", "s2", false)
	s3 := start("z-on-a", "z", a.Name, "")
	start("z-on-b", "z", b.Name, "")
	if got := sh(t, localOf(t, get(t, s3)), "ls /root | grep '^g' | tr '\\n' ' '"); got != "g0 g1 g2 " {
		t.Fatalf("z-on-a sees %q, want every generation's file", got)
	}

	type want struct {
		parent         string
		minMiB, maxMiB int64
	}
	check := func(ck *fbv1.Checkpoint, wants ...want) {
		t.Helper()
		got := waitTransfers(t, ck, len(wants))
		t.Logf("pulls of %s: %+v", ck.Name, got)
		for _, w := range wants {
			ok := false
			for _, p := range got {
				ok = ok || (p.parent == w.parent && p.bytes >= w.minMiB<<20 && p.bytes <= w.maxMiB<<20)
			}
			if !ok {
				t.Errorf("pulls of %s: %+v; want one from %q of %d–%d MiB", ck.Name, got, w.parent, w.minMiB, w.maxMiB)
			}
		}
	}
	check(x, want{"", 20, 21})
	check(y, want{"x", 2, 3}, want{"", 22, 23})
	check(z, want{"y", 2, 3}, want{"y", 2, 3})
}

// TestTransferMemoryFork: a memory checkpoint on gVisor, started on
// another node (same runsc there): the child continues the source's
// process, whose state came in the memory image.
func TestTransferMemoryFork(t *testing.T) {
	needNodes(t, 2)
	ns := testNamespace(t)
	a, b := node(0), node(1)
	src := newSandbox(ns, "msrc", a.Name, fbv1.RuntimeGVisor)
	create(t, src)
	l := running(t, src, fbv1.PhaseRunning)
	sh(t, l, "(i=0; while true; do i=$((i+1)); echo $i > /tmp/n.new; mv /tmp/n.new /tmp/n; sleep 0.1; done) >/dev/null 2>&1 &")
	clustertest.Eventually(t, 30*time.Second, "counter running", func() (bool, string) {
		out := sh(t, l, "cat /tmp/n 2>/dev/null || echo 0")
		n, _ := strconv.Atoi(strings.TrimSpace(out))
		return n > 3, out
	})
	ck := newCheckpoint(t, ns, "mem", "msrc", true)
	if ck.Status.Kind != "filesystem+memory" {
		t.Fatalf("checkpoint kind %q", ck.Status.Kind)
	}
	before, _ := strconv.Atoi(strings.TrimSpace(sh(t, l, "cat /tmp/n")))
	kid := fromCheckpoint(ns, "mkid", "mem", b.Name)
	create(t, kid)
	lk := running(t, kid, fbv1.PhaseRunning)
	p := waitTransfers(t, ck, 1)[0]
	t.Logf("memory pull: %+v", p)
	// The counter runs on in the child, from where the image left it.
	clustertest.Eventually(t, 30*time.Second, "child's counter moves", func() (bool, string) {
		out := sh(t, lk, "cat /tmp/n")
		n, _ := strconv.Atoi(strings.TrimSpace(out))
		return n > 0 && n+50 > before, out
	})
	n1, _ := strconv.Atoi(strings.TrimSpace(sh(t, lk, "cat /tmp/n")))
	clustertest.Eventually(t, 30*time.Second, "child's counter moves on", func() (bool, string) {
		n, _ := strconv.Atoi(strings.TrimSpace(sh(t, lk, "cat /tmp/n")))
		return n > n1, fmt.Sprint(n)
	})
	noHalfCheckpoint(t, b)
}

// TestTransferKilled: the sender, then the receiver, SIGKILLed while a
// checkpoint streams: the child reports the failure, neither node keeps
// half a checkpoint, and the pull is retried and succeeds once the node
// is back.
func TestTransferKilled(t *testing.T) {
	needNodes(t, 2)
	keepRunning(t)
	ns := testNamespace(t)
	a, b := node(0), node(1)
	src := newSandbox(ns, "big", a.Name, fbv1.RuntimeCrun)
	create(t, src)
	sh(t, running(t, src, fbv1.PhaseRunning), "dd if=/dev/urandom of=/root/blob bs=1M count=300 2>/dev/null")
	for i, victim := range []*clustertest.Node{a, b} {
		name := fmt.Sprintf("big-%d", i)
		ck := newCheckpoint(t, ns, name, "big", false)
		kid := fromCheckpoint(ns, "kid-"+name, name, b.Name)
		create(t, kid)
		// Mid-stream: b's store has the subvolume being received.
		recv := filepath.Join(b.StateDir, "snapshots", "committed", ck.Status.Replicas[0].LocalID)
		meta := filepath.Join(b.StateDir, "snapshots", "meta", ck.Status.Replicas[0].LocalID+".json")
		clustertest.Eventually(t, time.Minute, "the stream to "+b.Name+" flowing", func() (bool, string) {
			_, err := os.Stat(filepath.Join(recv, "upper"))
			_, merr := os.Stat(meta)
			return err == nil && merr != nil, fmt.Sprint(err, merr)
		})
		if err := victim.Kill(context.Background()); err != nil {
			t.Fatal(err)
		}
		if victim == a {
			clustertest.Eventually(t, time.Minute, kid.Name+" reports the failed pull", func() (bool, string) {
				get(t, kid)
				return strings.Contains(kid.Status.Message, "pull failed"), kid.Status.Message
			})
			noHalfCheckpoint(t, b)
		}
		if err := victim.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		running(t, kid, fbv1.PhaseRunning)
		if !replicaOn(t, ck, b.Name) {
			t.Fatalf("no replica of %s on %s after the retry", name, b.Name)
		}
		noHalfCheckpoint(t, a)
		noHalfCheckpoint(t, b)
	}
}
