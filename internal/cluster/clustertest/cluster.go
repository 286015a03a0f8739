package clustertest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/internal/network"
)

// Options shape a Cluster.
type Options struct {
	// Nodes is how many node agents run (default 3).
	Nodes int
	// Dir is the work directory (default: a new one under os.TempDir);
	// it is removed by Close.
	Dir string
	// Bin and Agent are the forkbox and forkbox-agent binaries (default:
	// built into Dir from this checkout).
	Bin, Agent string
	// Slots is each node's --max-sandboxes (default 8); Preboot its
	// --preboot (default 0: nothing booted ahead, the lightest load).
	Slots, Preboot int
	// LeaseDuration is each node's --lease-duration (default 6s).
	LeaseDuration time.Duration
	// BtrfsSize is the size of each node's btrfs file (default 4Gi).
	BtrfsSize string
	// LogLevel of the processes (default debug).
	LogLevel string
}

func (o *Options) setDefaults() {
	if o.Nodes == 0 {
		o.Nodes = 3
	}
	if o.Slots == 0 {
		o.Slots = 8
	}
	if o.LeaseDuration == 0 {
		o.LeaseDuration = 6 * time.Second
	}
	if o.BtrfsSize == "" {
		o.BtrfsSize = "4Gi"
	}
	if o.LogLevel == "" {
		o.LogLevel = "debug"
	}
}

// Cluster is forkbox's cluster mode on this machine: `forkbox
// controller` and Options.Nodes `forkbox serve --cluster` node agents as
// processes against a Plane, each process with a kubeconfig of a user
// bound only to its ClusterRole from deploy/rbac (each node agent with a
// token bound to its own node, see addNode), each node in its own
// network namespace on a host bridge (see hostnet.go). Close removes all
// of it, and Leaks says what it did not.
type Cluster struct {
	Plane *Plane
	// Dir holds the binaries, kubeconfigs, logs and the nodes' state.
	Dir, Bin, Agent string
	// RunID names this cluster's host objects (bridge, netns, cgroups).
	RunID string
	// Token is every node's API token on its TCP endpoint.
	Token string
	Nodes []*Node

	opts       Options
	net        *hostNet
	proxy      *apiProxy
	controller *exec.Cmd
	ctrlDone   chan struct{}
	wg         sync.WaitGroup // the processes' waiters
}

// Build builds forkbox and forkbox-agent from this checkout into dir.
func Build(ctx context.Context, dir string) (bin, agent string, err error) {
	bin, agent = filepath.Join(dir, "forkbox"), filepath.Join(dir, "forkbox-agent")
	for out, pkg := range map[string]string{bin: "./cmd/forkbox", agent: "./cmd/forkbox-agent"} {
		cmd := exec.CommandContext(ctx, "go", "build", "-o", out, pkg)
		cmd.Dir, cmd.Env = Root(), append(os.Environ(), "CGO_ENABLED=0")
		if b, err := cmd.CombinedOutput(); err != nil {
			return "", "", fmt.Errorf("build %s: %v\n%s", pkg, err, b)
		}
	}
	return bin, agent, nil
}

// StartCluster starts the controller and the nodes against p (which must
// be running) and waits until every node is Ready. On failure it removes
// what it made.
func StartCluster(ctx context.Context, p *Plane, o Options) (_ *Cluster, err error) {
	o.setDefaults()
	c := &Cluster{Plane: p, opts: o, RunID: fmt.Sprintf("%04x", os.Getpid()&0xffff)}
	defer func() {
		if err != nil {
			err = errors.Join(err, c.Close(context.WithoutCancel(ctx)))
		}
	}()
	if c.Dir = o.Dir; c.Dir == "" {
		if c.Dir, err = os.MkdirTemp("", "forkbox-cluster-"); err != nil {
			return nil, err
		}
	} else if err := os.MkdirAll(c.Dir, 0o755); err != nil {
		return nil, err
	}
	tok := make([]byte, 16)
	rand.Read(tok)
	c.Token = hex.EncodeToString(tok)
	if c.Bin, c.Agent = o.Bin, o.Agent; c.Bin == "" || c.Agent == "" {
		if c.Bin, c.Agent, err = Build(ctx, c.Dir); err != nil {
			return nil, err
		}
	}
	// The daemons hand the agent's path to the runtimes, which resolve
	// it from elsewhere: absolute paths only.
	if c.Bin, err = filepath.Abs(c.Bin); err != nil {
		return nil, err
	}
	if c.Agent, err = filepath.Abs(c.Agent); err != nil {
		return nil, err
	}
	if c.net, err = setupHostNet(ctx, "fbh"+c.RunID, os.Getpid()); err != nil {
		return nil, err
	}
	rbac := filepath.Join(Root(), "deploy", "rbac")
	ctrlCfg := filepath.Join(c.Dir, "forkbox-controller.kubeconfig")
	if err := p.UserKubeconfig(ctx, "forkbox-controller", filepath.Join(rbac, "controller", "role.yaml"), ctrlCfg); err != nil {
		return nil, err
	}
	apiURL, err := url.Parse(p.Config.Host)
	if err != nil {
		return nil, err
	}
	if c.proxy, err = startAPIProxy(net.JoinHostPort(c.net.addr(-1).String(), "0"), apiURL.Host); err != nil {
		return nil, err
	}
	if err := c.startController(ctrlCfg); err != nil {
		return nil, err
	}
	for i := range o.Nodes {
		n, err := c.addNode(ctx, i)
		if err != nil {
			return nil, err
		}
		if err := n.Start(ctx); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// addNode makes node i's namespace, directories and identity: a token
// of the node agents' service account bound to a Pod on node i, as a
// DaemonSet's pod has (see NodeKubeconfig), so the API server's node
// identity policy (deploy/policy) knows it as that node and no other.
func (c *Cluster) addNode(ctx context.Context, i int) (*Node, error) {
	id := fmt.Sprintf("%s-%d", c.RunID, i)
	dir := filepath.Join(c.Dir, fmt.Sprintf("node-%d", i))
	n := &Node{Name: "node-" + id, Index: i, NetNS: "fbn" + id, IP: c.net.addr(i).String(),
		StateDir: filepath.Join(dir, "state"), RunDir: filepath.Join(dir, "run"), Socket: filepath.Join(dir, "forkbox.sock"),
		Slots: c.opts.Slots, Preboot: c.opts.Preboot, c: c,
		bridge: fmt.Sprintf("fbxcl%s%d", c.RunID, i), table: "forkbox_cl_" + strings.ReplaceAll(id, "-", "_"),
		cgroup: "forkbox-cl-" + id, subnet: fmt.Sprintf("10.%d.0.0/20", 100+i), vethPfx: "c" + c.RunID,
		hostV: fmt.Sprintf("fbh%sn%d", c.RunID, i)}
	n.Endpoint = fmt.Sprintf("%s:%d", n.IP, apiPort)
	n.PreviewEndpoint = fmt.Sprintf("%s:%d", n.IP, previewPort)
	n.Client = &client.Client{Socket: n.Socket}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	n.Kubeconfig = filepath.Join(dir, "kubeconfig")
	if err := c.Plane.NodeKubeconfig(ctx, n.Name, n.Kubeconfig, c.proxy.Addr()); err != nil {
		return nil, err
	}
	c.Nodes = append(c.Nodes, n)
	if err := c.net.addNode(ctx, i, n.NetNS, n.hostV); err != nil {
		return nil, err
	}
	n.nsRecord = nsRecord(n.NetNS)
	return n, nil
}

func (c *Cluster) startController(kubeconfig string) error {
	log, err := os.Create(c.ControllerLogPath())
	if err != nil {
		return err
	}
	cmd := exec.Command(c.Bin, "controller", "--kubeconfig", kubeconfig, "--namespace", Namespace, "--log-level", c.opts.LogLevel)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		log.Close()
		return err
	}
	c.controller, c.ctrlDone = cmd, make(chan struct{})
	c.wg.Add(1)
	go func() { // ends with the process; Close waits for it
		defer c.wg.Done()
		cmd.Wait()
		log.Close()
		close(c.ctrlDone)
	}()
	return nil
}

// ControllerLogPath is the controller's log file.
func (c *Cluster) ControllerLogPath() string { return filepath.Join(c.Dir, "controller.log") }

// Node returns the node called name (nil if none).
func (c *Cluster) Node(name string) *Node {
	i := slices.IndexFunc(c.Nodes, func(n *Node) bool { return n.Name == name })
	if i < 0 {
		return nil
	}
	return c.Nodes[i]
}

// ImportImage imports an image archive on every node; it returns the
// image's name.
func (c *Cluster) ImportImage(ctx context.Context, archive string) (string, error) {
	name := ""
	for _, n := range c.Nodes {
		im, err := n.Client.ImportImage(ctx, archive, "", nil)
		if err != nil {
			return "", fmt.Errorf("import %s on %s: %w", archive, n.Name, err)
		}
		name = im.Name
	}
	return name, nil
}

// Logs is the end of every process's log, at most max bytes of each.
func (c *Cluster) Logs(max int) string {
	var b strings.Builder
	paths := []string{c.ControllerLogPath()}
	for _, n := range c.Nodes {
		paths = append(paths, n.LogPath())
	}
	for _, p := range paths {
		out, _ := os.ReadFile(p)
		fmt.Fprintf(&b, "---- %s (end) ----\n%s\n", filepath.Base(p), tail(out, max))
	}
	return b.String()
}

// LogLines are the lines of the processes' logs (controller and nodes)
// that contain substr, each prefixed with its log's name; at most max.
func (c *Cluster) LogLines(substr string, max int) []string {
	var out []string
	paths := []string{c.ControllerLogPath()}
	for _, n := range c.Nodes {
		paths = append(paths, n.LogPath())
	}
	for _, p := range paths {
		b, _ := os.ReadFile(p)
		for _, l := range strings.Split(string(b), "\n") {
			if strings.Contains(l, substr) && len(out) < max {
				out = append(out, filepath.Base(p)+": "+l)
			}
		}
	}
	return out
}

// Close stops the nodes (SIGTERM) and the controller, removes each
// node's host state through its own `forkbox uninstall`, then the
// namespaces, the bridge and Dir. What is left after that is an error
// (see Leaks).
func (c *Cluster) Close(ctx context.Context) error {
	var errs []error
	for _, n := range c.Nodes {
		errs = append(errs, n.Stop(ctx))
	}
	if c.controller != nil {
		select {
		case <-c.ctrlDone:
		default:
			c.controller.Process.Signal(syscall.SIGTERM)
			select {
			case <-c.ctrlDone:
			case <-time.After(30 * time.Second):
				c.controller.Process.Kill()
				<-c.ctrlDone
			}
		}
	}
	for _, n := range c.Nodes {
		errs = append(errs, n.uninstall(ctx))
	}
	// The forwarding records are named after their namespace's inode,
	// which a namespace made later (another run's, on the same host) may
	// take once these are deleted: they are audited while they stand.
	records := c.recordLeaks()
	for _, n := range c.Nodes {
		errs = append(errs, c.net.delNode(ctx, n.NetNS, n.hostV))
	}
	if c.proxy != nil {
		errs = append(errs, c.proxy.Close())
	}
	if c.net != nil {
		errs = append(errs, c.net.destroy(ctx))
	}
	c.wg.Wait()
	logs := ""
	if len(records) > 0 { // what the nodes said, uninstall included, goes with the directory
		logs = "\n" + c.Logs(6000)
	}
	if c.Dir != "" {
		errs = append(errs, os.RemoveAll(c.Dir))
	}
	if l := append(c.leaks(), records...); len(l) > 0 {
		errs = append(errs, fmt.Errorf("left behind by the cluster:\n  %s%s", strings.Join(l, "\n  "), logs))
	}
	for _, n := range c.Nodes { // not the host's: never leave them, even after a failure
		if n.nsRecord != "" {
			os.RemoveAll(filepath.Join(network.ForwardRecordDir(), n.nsRecord))
		}
	}
	return errors.Join(errs...)
}
