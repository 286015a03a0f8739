package main

// The cluster section (--sections cluster; not in the default run: it
// needs root and the control plane's binaries, KUBEBUILDER_ASSETS). It
// starts the 3-node test cluster (internal/cluster/clustertest, through
// internal/cluster/clusterlab: a real kube-apiserver and etcd, `forkbox
// controller`, three `forkbox serve --cluster` agents, each in its own
// network namespace with its own btrfs), and for each source size writes
// that much into a source Sandbox on the first node (the fork section's
// 20 KB files), then, --cluster-reps times:
//
//  1. a Checkpoint object of the source, timed to Ready;
//  2. a child Sandbox of it pinned on the same node (spec.nodeName);
//  3. a child pinned on the second node, which pulls the checkpoint first
//     (a full send);
//  4. a second child there, from the replica it now holds;
//  5. that child writes 1 MB and is checkpointed; a child of that
//     checkpoint pinned on the first node, which holds its parent, so the
//     send is incremental from it.
//
// Each child is timed from its object's creation until it is Running and
// answers an exec on its node. Each pull's bytes and time come from the
// checkpoint's Transferred event. Then the same source is forked as often
// through its node's own API (the single-host fork), for comparison in
// the same run. Everything a repetition made is deleted (and gone from
// the nodes) before the next.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fbclient "github.com/forkbox/forkbox/client"
	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
	"github.com/forkbox/forkbox/internal/cluster/clusterlab"
	"github.com/forkbox/forkbox/internal/cluster/clustertest"
)

const (
	// clusterDelta is what the child on the other node writes before the
	// checkpoint that travels incrementally.
	clusterDelta = 1_000_000
	// clusterTimeout bounds each wait (a 1 GB pull on a loaded host).
	clusterTimeout = 10 * time.Minute
	clusterNS      = "default"
)

// measureCluster runs the cluster section; dir is the bench's work
// directory (for a fresh build of the binaries).
func (b *bench) measureCluster(ctx context.Context, dir string) (_ []ClusterResult, err error) {
	o := b.opts
	bin, agent, err := binaries(ctx, dir, o.binDir)
	if err != nil {
		return nil, err
	}
	var largest int64
	for _, s := range o.clusterSizes {
		n, _ := parseSize(s)
		largest = max(largest, n)
	}
	lab, err := clusterlab.Up(ctx, clustertest.Options{Bin: bin, Agent: agent, LogLevel: "info",
		LeaseDuration: 15 * time.Second, BtrfsSize: clusterBtrfsSize(largest)}, progress)
	if err != nil {
		return nil, fmt.Errorf("cluster section: %w", err)
	}
	defer func() {
		if err != nil && ctx.Err() == nil {
			fmt.Fprint(os.Stderr, lab.Logs())
		}
		err = errors.Join(err, lab.Close())
	}()
	var out []ClusterResult
	for i, s := range o.clusterSizes {
		size, _ := parseSize(s)
		progress("cluster: %s source on %s", s, o.clusterRuntime)
		r, err := b.clusterSize(ctx, lab, fmt.Sprintf("s%d", i), s, size)
		if err != nil {
			return out, err
		}
		out = append(out, r)
	}
	return out, nil
}

// clusterBtrfsSize is each node's btrfs: room for the source, a copy
// received and one still being deleted, and the rest.
func clusterBtrfsSize(largest int64) string {
	return fmt.Sprintf("%dGi", max(4, 3*largest/(1<<30)+3))
}

// clusterSize measures one source size; pfx names its objects.
func (b *bench) clusterSize(ctx context.Context, lab *clusterlab.Lab, pfx, label string, size int64) (ClusterResult, error) {
	o := b.opts
	home, other := lab.Cluster.Nodes[0], lab.Cluster.Nodes[1]
	r := ClusterResult{Size: label, Bytes: size, Files: max(size/fileSize, 1), Runtime: o.clusterRuntime, Reps: o.clusterReps,
		SourceNode: home.Name, OtherNode: other.Name, DeltaBytes: clusterDelta}
	src := &fbv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: clusterNS, Name: pfx + "-src"},
		Spec: fbv1.SandboxSpec{Image: lab.Image, Runtime: fbv1.Runtime(o.clusterRuntime), NodeName: home.Name}}
	t := time.Now()
	_, local, err := lab.Run(ctx, src, clusterTimeout)
	if err != nil {
		return r, err
	}
	if err := sh(ctx, local, writeCmd(size)); err != nil {
		return r, fmt.Errorf("setup %s: %w", label, err)
	}
	r.SetupMS = ms(time.Since(t))
	progress("  %s: source ready on %s in %.1f s; %d repetitions", label, home.Name, r.SetupMS/1000, o.clusterReps)
	var s clusterSamples
	for i := range o.clusterReps {
		if err := b.clusterRep(ctx, lab, src, fmt.Sprintf("%s-%d", pfx, i), &s); err != nil {
			return r, err
		}
	}
	progress("  %s: the same source forked %d times through %s's own API", label, o.clusterReps, home.Name)
	nb := &bench{c: home.Client, opts: o, live: map[string]*fbclient.Sandbox{}}
	defer nb.closeLeft()
	for i := range o.clusterReps {
		capture, _, wall, err := nb.forkOnce(ctx, local, fmt.Sprintf("bench-single-%s-%d", label, i))
		if err != nil {
			return r, err
		}
		s.single, s.singleCapture = append(s.single, wall), append(s.singleCapture, capture)
	}
	r.finish(s)
	return r, lab.Delete(ctx, clusterTimeout, src)
}

// clusterRep is one repetition of the four cases; pfx names its objects.
func (b *bench) clusterRep(ctx context.Context, lab *clusterlab.Lab, src *fbv1.Sandbox, pfx string, s *clusterSamples) (err error) {
	home, other := lab.Cluster.Nodes[0].Name, lab.Cluster.Nodes[1].Name
	var made []client.Object // deleted at the end, last made first
	defer func() {
		slices.Reverse(made)
		err = errors.Join(err, lab.Delete(context.WithoutCancel(ctx), clusterTimeout, made...))
	}()
	child := func(name, ck, node string) (*fbv1.Sandbox, *fbclient.Sandbox, float64, error) {
		sb := &fbv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: clusterNS, Name: pfx + "-" + name},
			Spec: fbv1.SandboxSpec{Source: &fbv1.SandboxSource{Checkpoint: ck}, NodeName: node}}
		made = append(made, sb)
		took, local, err := lab.Run(ctx, sb, clusterTimeout)
		return sb, local, ms(took), err
	}
	pull := func(ck *fbv1.Checkpoint, node string) (Send, error) {
		p, err := lab.PullBy(ctx, ck, node, time.Minute)
		return Send{Bytes: p.Bytes, MS: p.MS, Parent: p.Parent}, err
	}

	ck, capture, err := lab.Checkpoint(ctx, clusterNS, pfx+"-ck", src.Name, clusterTimeout)
	made = append(made, ck)
	if err != nil {
		return err
	}
	s.capture = append(s.capture, ms(capture))

	same, _, d, err := child("same", ck.Name, home)
	if err != nil {
		return err
	}
	s.add(caseSame, d)
	if err := lab.Delete(ctx, clusterTimeout, same); err != nil {
		return err
	}

	full, _, d, err := child("full", ck.Name, other)
	if err != nil {
		return err
	}
	sent, err := pull(ck, other)
	if err != nil {
		return err
	}
	s.add(caseFull, d, sent)
	if err := lab.Delete(ctx, clusterTimeout, full); err != nil {
		return err
	}

	mid, midLocal, d, err := child("replica", ck.Name, other)
	if err != nil {
		return err
	}
	if ps, err := lab.Pulls(ctx, clusterNS, ck.Name); err != nil || len(ps) != 1 {
		return fmt.Errorf("checkpoint %s after a child of its replica on %s: pulls %+v (%v), want the first one only", ck.Name, other, ps, err)
	}
	s.add(caseReuse, d)

	if err := sh(ctx, midLocal, fmt.Sprintf("head -c %d /dev/urandom > /root/delta", clusterDelta)); err != nil {
		return err
	}
	ck2, _, err := lab.Checkpoint(ctx, clusterNS, pfx+"-ck2", mid.Name, clusterTimeout)
	made = append(made, ck2)
	if err != nil {
		return err
	}
	if _, _, d, err = child("incr", ck2.Name, home); err != nil {
		return err
	}
	if sent, err = pull(ck2, home); err != nil {
		return err
	}
	s.add(caseIncr, d, sent)
	progress("    %s: ready in ms: same node %.0f, full %.0f, replica %.0f, incremental %.0f (%s sent)", pfx,
		last(s.ready[caseSame]), last(s.ready[caseFull]), last(s.ready[caseReuse]), d, megabytes(sent.Bytes))
	return nil
}

func last(xs []float64) float64 { return xs[len(xs)-1] }
