package cluster

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
	"github.com/forkbox/forkbox/internal/cluster/clustertest"
)

// BenchmarkForkToReady: a child Sandbox of a checkpoint of a source with
// 100 MiB written (FORKBOX_BENCH_MB), from its creation to Running (crun), on the
// checkpoint's node, on another node that must pull it first (full), on
// that node again (the replica reused), and back on the first node from a
// child's checkpoint taken on the second (incremental from the first
// checkpoint, 1 MiB more). sent-B/op is what the pull sent. The timing
// polls the object every 50ms.
//
//	sudo KUBEBUILDER_ASSETS=/var/cache/forkbox/envtest go test ./e2e/cluster -run XXX -bench ForkToReady -benchtime 3x -timeout 20m
func BenchmarkForkToReady(b *testing.B) {
	needNodes(b, 2)
	ns := testNamespace(b)
	a, o := node(0), node(1)
	src := newSandbox(ns, "bsrc", a.Name, fbv1.RuntimeCrun)
	create(b, src)
	mb := 100
	if v, err := strconv.Atoi(os.Getenv("FORKBOX_BENCH_MB")); err == nil && v > 0 {
		mb = v
	}
	sh(b, running(b, src, fbv1.PhaseRunning), fmt.Sprintf("dd if=/dev/urandom of=/root/blob bs=1M count=%d 2>/dev/null", mb))
	seq := 0
	// ready creates a sandbox from ck on node and returns how long it
	// took to run; it is deleted afterwards (untimed).
	ready := func(b *testing.B, ck, node, then string) time.Duration {
		seq++
		sb := fromCheckpoint(ns, fmt.Sprintf("b-%d", seq), ck, node)
		start := time.Now()
		create(b, sb)
		clustertest.Eventually(b, 3*time.Minute, sb.Name+" running", func() (bool, string) {
			get(b, sb)
			return sb.Status.Phase == fbv1.PhaseRunning, sb.Status.Message
		})
		took := time.Since(start)
		b.StopTimer()
		if then != "" {
			sh(b, localOf(b, sb), then)
		}
		b.StartTimer()
		return took
	}
	drop := func(b *testing.B, objs ...client.Object) {
		b.StopTimer()
		for _, obj := range objs {
			if err := plane.Client.Delete(context.Background(), obj); err != nil {
				b.Fatal(err)
			}
		}
		for _, obj := range objs {
			clustertest.Eventually(b, 2*time.Minute, obj.GetName()+" gone", func() (bool, string) {
				err := plane.Client.Get(context.Background(), client.ObjectKeyFromObject(obj), obj)
				return err != nil, fmt.Sprint(obj.GetFinalizers())
			})
		}
		b.StartTimer()
	}
	sandbox := func(i int) *fbv1.Sandbox { return &fbv1.Sandbox{ObjectMeta: objMeta(ns, fmt.Sprintf("b-%d", i))} }
	report := func(b *testing.B, total time.Duration, ck *fbv1.Checkpoint) {
		b.ReportMetric(float64(total.Milliseconds())/float64(b.N), "ms/ready")
		b.ReportMetric(0, "ns/op")
		if ck != nil {
			if ps := transfers(b, ck); len(ps) > 0 {
				b.ReportMetric(float64(ps[len(ps)-1].bytes), "sent-B/op")
			}
		}
	}
	b.Run("same-node", func(b *testing.B) {
		ck := newCheckpoint(b, ns, fmt.Sprintf("bs-%d", seq), "bsrc", false)
		var total time.Duration
		for range b.N {
			total += ready(b, ck.Name, a.Name, "")
			drop(b, sandbox(seq))
		}
		report(b, total, nil)
		drop(b, ck)
	})
	var full *fbv1.Checkpoint
	b.Run("cross-node-full", func(b *testing.B) {
		var total time.Duration
		for i := range b.N {
			b.StopTimer()
			full = newCheckpoint(b, ns, fmt.Sprintf("bf-%d-%d", seq, i), "bsrc", false)
			b.StartTimer()
			total += ready(b, full.Name, o.Name, "")
			report(b, total, full)
			drop(b, sandbox(seq))
		}
	})
	b.Run("replica-reused", func(b *testing.B) {
		var total time.Duration
		for range b.N {
			total += ready(b, full.Name, o.Name, "")
			drop(b, sandbox(seq))
		}
		report(b, total, nil)
	})
	b.Run("cross-node-incremental", func(b *testing.B) {
		var total time.Duration
		for i := range b.N {
			b.StopTimer()
			ready(b, full.Name, o.Name, "dd if=/dev/urandom of=/root/more bs=1M count=1 2>/dev/null")
			mid := sandbox(seq)
			inc := newCheckpoint(b, ns, fmt.Sprintf("bi-%d-%d", seq, i), mid.Name, false)
			b.StartTimer()
			total += ready(b, inc.Name, a.Name, "")
			report(b, total, inc)
			drop(b, sandbox(seq), mid, inc)
		}
	})
}

func objMeta(ns, name string) metav1.ObjectMeta { return metav1.ObjectMeta{Namespace: ns, Name: name} }
