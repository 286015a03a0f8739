// Package cluster tests cluster mode end to end: a real kube-apiserver and
// etcd (envtest, KUBEBUILDER_ASSETS), `forkbox controller` and three
// `forkbox serve --cluster` node agents as processes, each with a
// kubeconfig of a user bound only to its ClusterRole from deploy/rbac,
// and each node's real daemon (runsc, crun, btrfs, netns, nftables) in a
// network namespace of its own, reached at its own address
// (clustertest.Cluster). After the suite a leak audit fails it if
// anything of the cluster is left on the host. It needs root; outside CI
// a missing prerequisite skips it, in CI (CI=true) it fails.
package cluster

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/forkbox/forkbox/internal/cluster/clustertest"
	"github.com/forkbox/forkbox/internal/testimage"
)

var plane clustertest.Plane

// cl is the test cluster: its nodes run for the whole suite (a test that
// stops one starts it again before it ends).
var cl *clustertest.Cluster

// env is what every test shares.
var env struct {
	image string // busybox, imported on every node
	skip  string
}

// Defaults of the test cluster: FORKBOX_CLUSTER_NODES nodes (3), each
// with nodeSlots slots (small, so a test can fill one), a short Lease.
const (
	defaultNodes  = 3
	nodeSlots     = 4
	leaseDuration = 6 * time.Second
)

func prerequisites() string {
	if os.Geteuid() != 0 {
		return "needs root"
	}
	for _, bin := range []string{"runsc", "crun", "mkfs.btrfs", "nsenter", "ip"} {
		if _, err := exec.LookPath(bin); err != nil {
			return bin + " is not installed (run ./scripts/setup.sh)"
		}
	}
	return testimageAvailable()
}

func testimageAvailable() string {
	if err := testimage.Available(); err != nil {
		return err.Error()
	}
	return ""
}

func TestMain(m *testing.M) {
	if why := prerequisites(); why != "" {
		if os.Getenv("CI") == "true" {
			fmt.Fprintln(os.Stderr, "e2e/cluster: FAIL: prerequisite missing in CI:", why)
			os.Exit(1)
		}
		env.skip = why
	}
	os.Exit(clustertest.Main(&suite{m}, &plane))
}

// suite wraps the package's tests with the cluster's processes, started
// once the control plane is up.
type suite struct{ m *testing.M }

func (w *suite) Run() int {
	if env.skip != "" || plane.Config == nil {
		return w.m.Run()
	}
	code, err := run(w.m)
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e/cluster:", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

func clusterSize() int {
	if n, err := strconv.Atoi(os.Getenv("FORKBOX_CLUSTER_NODES")); err == nil && n > 0 {
		return n
	}
	return defaultNodes
}

func run(m *testing.M) (code int, err error) {
	ctx := context.Background()
	cl, err = clustertest.StartCluster(ctx, &plane, clustertest.Options{Nodes: clusterSize(), Slots: nodeSlots, LeaseDuration: leaseDuration})
	if err != nil {
		return 1, err
	}
	defer func() {
		if code != 0 {
			fmt.Fprint(os.Stderr, cl.Logs(6000))
		}
		stopGateway() // gateway_test.go
		// The leak audit: Close fails when anything is left.
		if cerr := cl.Close(ctx); cerr != nil {
			code, err = 1, fmt.Errorf("%v\ncleanup: %w", err, cerr)
		}
	}()
	img, err := testimage.Busybox()
	if err != nil {
		return 1, err
	}
	archive := filepath.Join(cl.Dir, "busybox.tar")
	if err := testimage.WriteOCIArchive(img, "e2e.local/busybox:latest", archive); err != nil {
		return 1, err
	}
	if env.image, err = cl.ImportImage(ctx, archive); err != nil {
		return 1, err
	}
	code = m.Run()
	// The agents' own writes must all pass the node identity policy
	// (deploy/policy): a refusal in any log fails the run.
	if bad := cl.LogLines("forkbox-node-identity", 20); len(bad) > 0 {
		fmt.Fprintf(os.Stderr, "FAIL: the node identity policy refused writes of the cluster's own processes:\n  %s\n", strings.Join(bad, "\n  "))
		code = 1
	}
	return code, nil
}

// nodes are the cluster's nodes, node(i) the i-th, nodeNamed the one
// called name (nil if none).
func nodes() []*clustertest.Node              { return cl.Nodes }
func node(i int) *clustertest.Node            { return cl.Nodes[i] }
func nodeNamed(name string) *clustertest.Node { return cl.Node(name) }

func waitFor(timeout time.Duration, f func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond) // polling a condition with a deadline
	}
}

// need skips t when this machine cannot run the suite.
func need(t testing.TB) {
	t.Helper()
	plane.Need(t)
	if env.skip != "" {
		t.Skip(env.skip)
	}
}

// needNodes is need, and skips t on a cluster of fewer than n nodes.
func needNodes(t testing.TB, n int) {
	t.Helper()
	need(t)
	if len(cl.Nodes) < n {
		t.Skipf("needs %d nodes, the cluster has %d (FORKBOX_CLUSTER_NODES)", n, len(cl.Nodes))
	}
}

// keepRunning makes sure, when t ends, that every node runs again with
// the suite's settings (for tests that stop, kill or reconfigure one).
func keepRunning(t *testing.T) {
	t.Cleanup(func() {
		for _, n := range cl.Nodes {
			changed := n.Slots != nodeSlots
			n.Slots = nodeSlots
			if changed && n.Running() {
				if err := n.Restart(context.Background()); err != nil {
					t.Errorf("restart %s: %v", n.Name, err)
				}
			}
			if !n.Running() {
				if err := n.Start(context.Background()); err != nil {
					t.Errorf("start %s again: %v", n.Name, err)
				}
			}
		}
	})
}
