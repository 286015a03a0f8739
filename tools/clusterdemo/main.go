// Command clusterdemo is the cluster demo (scripts/cluster-demo.sh): a
// real control plane (kube-apiserver and etcd through envtest), `forkbox
// controller` and three `forkbox serve --cluster` node agents on this
// machine, each in its own network namespace with its own btrfs, state
// dir and runsc root (internal/cluster/clustertest, the harness of the
// cluster e2e tests, started through internal/cluster/clusterlab, which
// the bench's cluster section shares). It creates a sandbox, writes 200 MB in it, forks it
// into 6 children through a Fork object, and prints where each child
// landed and how long it took from the Fork to Running, as a table or as
// JSON. It removes everything it made when it ends, also on Ctrl-C.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fbclient "github.com/forkbox/forkbox/client"
	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
	"github.com/forkbox/forkbox/internal/cluster/clusterlab"
	"github.com/forkbox/forkbox/internal/cluster/clustertest"
)

// Child is one fork child's placement and timing.
type Child struct {
	ID         string `json:"id"`
	Node       string `json:"node"`
	LocalID    string `json:"local_id,omitempty"`
	ReadyMS    int64  `json:"ready_ms"`
	TransferMS int64  `json:"transfer_ms"`
	Bytes      int64  `json:"bytes,omitempty"` // of the source's file, as the child sees it
	Error      string `json:"error,omitempty"`
}

// Report is the demo's result (--json).
type Report struct {
	Runtime      string  `json:"runtime"`
	Nodes        []Node  `json:"nodes"`
	Source       Source  `json:"source"`
	CheckpointMS int64   `json:"checkpoint_ms"`
	ForkMS       int64   `json:"fork_ms"` // the Fork to its last child Running
	Children     []Child `json:"children"`
	// SingleHostForkMS is, for comparison, the same fork through the
	// source node's own API (one daemon, no objects): the whole call,
	// which returns with every child running. It forks
	// SingleHostChildren: the children, or as many as the node's slots
	// hold beside the source.
	SingleHostForkMS   int64    `json:"single_host_fork_ms"`
	SingleHostChildren int      `json:"single_host_children"`
	Notes              []string `json:"notes,omitempty"`
}

// Node is one node of the demo cluster.
type Node struct {
	Name     string `json:"name"`
	Endpoint string `json:"endpoint"`
	Children int    `json:"children"`
}

// Source is the forked sandbox.
type Source struct {
	Node    string `json:"node"`
	Bytes   int64  `json:"bytes"`
	WriteMS int64  `json:"write_ms"`
}

func main() {
	o := options{}
	flag.BoolVar(&o.json, "json", false, "print the result as JSON")
	flag.IntVar(&o.nodes, "nodes", 3, "node agents")
	flag.IntVar(&o.children, "children", 6, "children to fork")
	flag.IntVar(&o.mb, "write-mb", 200, "MB the source writes before the fork")
	flag.StringVar(&o.runtime, "runtime", "gvisor", "gvisor or crun")
	flag.IntVar(&o.slots, "slots", 4, "sandbox slots of each node (4: the source's node takes 3 children, the rest spill to the others, which pull the checkpoint)")
	flag.IntVar(&o.preboot, "preboot", 2, "gVisor sandboxes each node keeps booted ahead (its serve default)")
	flag.StringVar(&o.bin, "bin", "", "forkbox binary (default: built from this checkout)")
	flag.StringVar(&o.agent, "agent", "", "forkbox-agent binary (default: built from this checkout)")
	flag.Parse()
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := run(ctx, o)
	if err != nil {
		if ctx.Err() != nil {
			fmt.Fprintln(os.Stderr, "cluster-demo: interrupted; what it made is removed (see above)")
			os.Exit(130)
		}
		fmt.Fprintln(os.Stderr, "cluster-demo:", err)
		os.Exit(1)
	}
	if o.json {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		enc.Encode(rep)
		return
	}
	printTable(os.Stdout, rep)
}

type options struct {
	json                                bool
	nodes, children, mb, slots, preboot int
	runtime, bin, agent                 string
}

func say(format string, a ...any) { fmt.Fprintf(os.Stderr, "==> "+format+"\n", a...) }

func run(ctx context.Context, o options) (_ *Report, err error) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		os.Setenv("KUBEBUILDER_ASSETS", "/var/cache/forkbox/envtest")
	}
	lab, err := clusterlab.Up(ctx, clustertest.Options{Nodes: o.nodes, Slots: o.slots, Preboot: o.preboot,
		Bin: o.bin, Agent: o.agent, LogLevel: "info", LeaseDuration: 15 * time.Second}, say)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			fmt.Fprint(os.Stderr, lab.Logs())
		}
		err = errors.Join(err, lab.Close())
	}()
	return demo(ctx, lab, o)
}

// demo creates the source, writes into it, forks it and times the
// children.
func demo(ctx context.Context, lab *clusterlab.Lab, o options) (*Report, error) {
	cl, c := lab.Cluster, lab.Client()
	const ns = "default"
	rep := &Report{Runtime: o.runtime}
	src := &fbv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "source"},
		Spec: fbv1.SandboxSpec{Image: lab.Image, Runtime: fbv1.Runtime(o.runtime)}}
	say("creating sandbox %s/source; waiting for it to run", ns)
	_, local, err := lab.Run(ctx, src, 3*time.Minute)
	if err != nil {
		return nil, err
	}
	n := cl.Node(src.Spec.NodeName)
	say("source runs on %s as %s; writing %d MB", n.Name, local.ID, o.mb)
	t := time.Now()
	if _, err := clusterlab.Shell(ctx, local, fmt.Sprintf("dd if=/dev/urandom of=/root/data bs=1M count=%d 2>/dev/null && sync", o.mb)); err != nil {
		return nil, err
	}
	rep.Source = Source{Node: n.Name, Bytes: int64(o.mb) << 20, WriteMS: time.Since(t).Milliseconds()}

	wc := lab.Watcher()
	w, err := wc.Watch(ctx, &fbv1.SandboxList{}, client.InNamespace(ns), client.MatchingLabels{fbv1.ForkLabel: "demo"})
	if err != nil {
		return nil, err
	}
	defer w.Stop()
	ckw, err := wc.Watch(ctx, &fbv1.CheckpointList{}, client.InNamespace(ns))
	if err != nil {
		return nil, err
	}
	defer ckw.Stop()
	fk := &fbv1.Fork{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "demo"},
		Spec: fbv1.ForkSpec{Source: fbv1.ForkSource{Sandbox: "source"}, Count: int32(o.children)}}
	say("forking %d children (Fork %s/demo)", o.children, ns)
	start := time.Now()
	if err := c.Create(ctx, fk); err != nil {
		return nil, err
	}
	children, err := follow(ctx, w, ckw, start, o.children, rep)
	if err != nil {
		return nil, err
	}
	rep.ForkMS = time.Since(start).Milliseconds()
	for _, ch := range children {
		if ch.Error == "" {
			if sb, err := cl.Node(ch.Node).Client.Sandbox(ctx, ch.LocalID); err == nil {
				if out, err := clusterlab.Shell(ctx, sb, "wc -c < /root/data"); err == nil {
					fmt.Sscan(out, &ch.Bytes)
				}
			}
		}
		rep.Children = append(rep.Children, *ch)
	}
	rep.SingleHostChildren = min(o.children, n.Slots-1) // one daemon holds no more
	if rep.SingleHostForkMS, err = singleHost(ctx, c, n, local, rep.SingleHostChildren); err != nil {
		return nil, err
	}
	for _, n := range cl.Nodes {
		k := 0
		for _, ch := range rep.Children {
			if ch.Node == n.Name {
				k++
			}
		}
		rep.Nodes = append(rep.Nodes, Node{Name: n.Name, Endpoint: n.Endpoint, Children: k})
	}
	if err := transferTimes(ctx, lab, ns, rep); err != nil {
		return nil, err
	}
	rep.Notes = append(rep.Notes, "children fill the checkpoint's node first and spill to the others; "+
		"transfer_ms is the pull of the checkpoint by a child's node (0 on the checkpoint's node, and for a node's later children, which reuse its copy)")
	return rep, nil
}

// transferTimes sets each node's first child's transfer_ms from the
// Transferred events of the fork's checkpoint.
func transferTimes(ctx context.Context, lab *clusterlab.Lab, ns string, rep *Report) error {
	var fk fbv1.Fork
	if err := lab.Client().Get(ctx, client.ObjectKey{Namespace: ns, Name: "demo"}, &fk); err != nil {
		return err
	}
	pulls, err := lab.Pulls(ctx, ns, fk.Status.Checkpoint)
	if err != nil {
		return err
	}
	pulled := map[string]int64{}
	for _, p := range pulls {
		pulled[p.Node] = p.MS
	}
	for i := range rep.Children {
		ch := &rep.Children[i]
		if ms, ok := pulled[ch.Node]; ok {
			ch.TransferMS = ms
			delete(pulled, ch.Node) // the node's later children reuse its copy
		}
	}
	return nil
}

// singleHost deletes the cluster fork's children (to free their slots),
// then forks the source through its node's own API, and returns how long
// that took; the children are closed after.
func singleHost(ctx context.Context, c client.Client, n *clustertest.Node, src *fbclient.Sandbox, count int) (int64, error) {
	say("for comparison: the same fork (%d children) through %s's own API", count, n.Name)
	if err := c.DeleteAllOf(ctx, &fbv1.Sandbox{}, client.InNamespace("default"), client.MatchingLabels{fbv1.ForkLabel: "demo"}); err != nil {
		return 0, err
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		var l fbv1.SandboxList
		if err := c.List(ctx, &l, client.InNamespace("default"), client.MatchingLabels{fbv1.ForkLabel: "demo"}); err != nil {
			return 0, err
		}
		if len(l.Items) == 0 {
			break
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("%d children of the cluster fork not gone after 2m", len(l.Items))
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(50 * time.Millisecond): // polling a condition with a deadline
		}
	}
	t := time.Now()
	res, err := src.Fork(ctx, fbclient.ForkOptions{Count: count})
	if err != nil {
		return 0, fmt.Errorf("single-host fork: %w", err)
	}
	took := time.Since(t).Milliseconds()
	for _, ch := range res.Children {
		if ch.Err != nil {
			return 0, fmt.Errorf("single-host fork: %w", ch.Err)
		}
		ch.Sandbox.Close(ctx)
	}
	return took, nil
}

// follow watches the fork's checkpoint and children until every child
// runs or is refused, and times each from start.
func follow(ctx context.Context, w, ckw watch.Interface, start time.Time, count int, rep *Report) ([]*Child, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	kids := map[string]*Child{}
	settled := 0
	for settled < count {
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("fork: %d of %d children settled: %w", settled, count, ctx.Err())
		case ev, ok := <-ckw.ResultChan():
			if !ok {
				return nil, errors.New("checkpoint watch ended")
			}
			if ck, isCk := ev.Object.(*fbv1.Checkpoint); isCk && ck.Name == "demo" && ck.Status.Phase == fbv1.CheckpointReady && rep.CheckpointMS == 0 {
				rep.CheckpointMS = time.Since(start).Milliseconds()
			}
		case ev, ok := <-w.ResultChan():
			if !ok {
				return nil, errors.New("sandbox watch ended")
			}
			sb, isSb := ev.Object.(*fbv1.Sandbox)
			if !isSb {
				continue
			}
			ch := kids[sb.Name]
			if ch == nil {
				ch = &Child{ID: sb.Name}
				kids[sb.Name] = ch
			}
			if ch.ReadyMS != 0 || ch.Error != "" {
				continue
			}
			ch.Node, ch.LocalID = sb.Spec.NodeName, sb.Status.LocalID
			c := meta.FindStatusCondition(sb.Status.Conditions, fbv1.ConditionScheduled)
			switch {
			case sb.Status.Phase == fbv1.PhaseRunning:
				ch.ReadyMS = max(time.Since(start).Milliseconds(), 1)
				settled++
			case sb.Status.Phase == fbv1.PhaseFailed,
				sb.Spec.NodeName == "" && c != nil && c.Status == metav1.ConditionFalse && strings.Contains(c.Message, "not on any node with room"):
				ch.Error = sb.Status.Message
				settled++
			}
		}
	}
	out := make([]*Child, 0, count)
	for i := range count {
		if ch := kids[fmt.Sprintf("demo-%d", i)]; ch != nil {
			out = append(out, ch)
		}
	}
	return out, nil
}

func printTable(w io.Writer, rep *Report) {
	fmt.Fprintf(w, "\nsource: %s, %d MB written in %d ms (%s)\n", rep.Source.Node, rep.Source.Bytes>>20, rep.Source.WriteMS, rep.Runtime)
	fmt.Fprintf(w, "fork of %d: checkpoint ready %d ms after the Fork, last child %d ms (a fork of %d on one daemon, through its API: %d ms)\n\n",
		len(rep.Children), rep.CheckpointMS, rep.ForkMS, rep.SingleHostChildren, rep.SingleHostForkMS)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CHILD\tNODE\tREADY_MS\tTRANSFER_MS\tSEES\t")
	for _, c := range rep.Children {
		if c.Error != "" {
			fmt.Fprintf(tw, "%s\t-\t-\t-\t%s\t\n", c.ID, c.Error)
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d MB\t\n", c.ID, c.Node, c.ReadyMS, c.TransferMS, c.Bytes>>20)
	}
	tw.Flush()
	fmt.Fprintln(w)
	for _, n := range rep.Nodes {
		fmt.Fprintf(w, "%s at %s: %d children\n", n.Name, n.Endpoint, n.Children)
	}
	for _, note := range rep.Notes {
		fmt.Fprintln(w, "note:", note)
	}
}
