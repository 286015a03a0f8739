package clustertest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/forkbox/forkbox/client"
	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
	"github.com/forkbox/forkbox/internal/cluster/kube"
)

// apiPort is the TCP port of each node's API on its own address;
// transferPort that of its checkpoint transfers (package transfer);
// previewPort that of its preview listener of sandbox ports.
const (
	apiPort      = 7443
	transferPort = 7444
	previewPort  = 7445
)

// Node is one `forkbox serve --cluster` node agent with its daemon, in
// its own network namespace, with its own state dir (and loop-mounted
// btrfs in it), run dir (and runsc root in it), bridge, subnet, nftables
// table and cgroup parent.
type Node struct {
	// Name is its ForkboxNode's name; Index its place in Cluster.Nodes.
	Name  string
	Index int
	// NetNS is its network namespace (under /run/netns); IP its address
	// on the nodes' network; Endpoint its API there (host:port, Token),
	// PreviewEndpoint its preview listener (serve --ports).
	NetNS, IP, Endpoint, PreviewEndpoint string
	// Socket is its API's unix socket; StateDir and RunDir its daemon's.
	Socket, StateDir, RunDir string
	// Slots is its --max-sandboxes, Preboot its --preboot; a change
	// applies from the next Start.
	Slots, Preboot int
	// Client speaks to its daemon through Socket.
	Client *client.Client
	// Kubeconfig is its agent's: the node agents' service account, with
	// a token bound to this node (Plane.NodeKubeconfig).
	Kubeconfig string

	c                      *Cluster
	bridge, table, cgroup  string
	subnet, vethPfx, hostV string
	nsRecord               string // its namespace's forwarding record

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
}

// TCPClient speaks to the node's daemon at its Endpoint, with the
// cluster's token, as another host would.
func (n *Node) TCPClient() *client.Client {
	return &client.Client{URL: "http://" + n.Endpoint, Token: n.c.Token}
}

// LogPath is the node's log file (all its runs, appended).
func (n *Node) LogPath() string { return filepath.Join(n.c.Dir, n.Name+".log") }

// daemonArgs are the flags that place the node's daemon (serve and
// uninstall share them).
func (n *Node) daemonArgs() []string {
	return []string{"--state-dir", n.StateDir, "--run-dir", n.RunDir, "--socket", n.Socket,
		"--agent", n.c.Agent, "--bridge", n.bridge, "--net-table", n.table, "--veth-prefix", n.vethPfx,
		"--subnet", n.subnet, "--cgroup-parent", n.cgroup, "--btrfs-size", n.c.opts.BtrfsSize,
		"--log-level", n.c.opts.LogLevel}
}

// inNetns is a command running bin with args inside the node's network
// namespace (only that one: mounts, PIDs and cgroups are the host's).
func (n *Node) inNetns(args ...string) *exec.Cmd {
	cmd := exec.Command("nsenter", append([]string{"--net=/run/netns/" + n.NetNS, "--", n.c.Bin}, args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // a Ctrl-C reaches the harness, which stops the node in order
	return cmd
}

// Running reports whether the node's process is running.
func (n *Node) Running() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.running()
}

func (n *Node) running() bool {
	if n.cmd == nil {
		return false
	}
	select {
	case <-n.done:
		return false
	default:
		return true
	}
}

// Pid is the node process's PID (0 when it is not running).
func (n *Node) Pid() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.running() {
		return 0
	}
	return n.cmd.Process.Pid
}

// Start starts the node and waits until its daemon answers and its
// ForkboxNode has been Ready since then.
func (n *Node) Start(ctx context.Context) error {
	n.mu.Lock()
	if n.running() {
		n.mu.Unlock()
		return fmt.Errorf("node %s is already running", n.Name)
	}
	log, err := os.OpenFile(n.LogPath(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		n.mu.Unlock()
		return err
	}
	fmt.Fprintf(log, "==== clustertest: start %s at %s ====\n", n.Name, time.Now().UTC().Format(time.RFC3339Nano))
	args := append([]string{"serve", "--cluster", "--node-name", n.Name, "--kubeconfig", n.Kubeconfig,
		"--cluster-namespace", Namespace, "--lease-duration", n.c.opts.LeaseDuration.String(),
		"--node-endpoint", n.Endpoint, "--tcp", n.Endpoint, "--api-token", n.c.Token,
		"--max-sandboxes", strconv.Itoa(n.Slots), "--preboot", strconv.Itoa(n.Preboot),
		"--transfer-listen", net.JoinHostPort(n.IP, strconv.Itoa(transferPort)), "--ports", n.PreviewEndpoint}, n.daemonArgs()...)
	cmd := n.inNetns(args...)
	cmd.Stdout, cmd.Stderr = log, log
	started := time.Now()
	if err := cmd.Start(); err != nil {
		log.Close()
		n.mu.Unlock()
		return fmt.Errorf("start node %s: %w", n.Name, err)
	}
	done := make(chan struct{})
	n.cmd, n.done = cmd, done
	n.c.wg.Add(1)
	go func() { // owned by the Cluster: it ends when the process does, and Close waits for it
		defer n.c.wg.Done()
		cmd.Wait()
		log.Close()
		close(done)
	}()
	n.mu.Unlock()
	return n.waitReady(ctx, started)
}

// waitReady waits for the daemon's API and a Ready ForkboxNode whose
// heartbeat is newer than since.
func (n *Node) waitReady(ctx context.Context, since time.Time) error {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	var last error
	for {
		if !n.Running() {
			b, _ := os.ReadFile(n.LogPath())
			return fmt.Errorf("node %s exited while starting; its log ends:\n%s", n.Name, tail(b, 3000))
		}
		last = n.ready(ctx, since)
		if last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			b, _ := os.ReadFile(n.LogPath())
			return fmt.Errorf("node %s not ready: %w; its log ends:\n%s", n.Name, last, tail(b, 3000))
		case <-time.After(100 * time.Millisecond): // polling a condition with a deadline
		}
	}
}

func (n *Node) ready(ctx context.Context, since time.Time) error {
	if _, err := n.Client.ListSandboxes(ctx, false); err != nil {
		return err
	}
	var l coordinationv1.Lease
	if err := n.c.Plane.Client.Get(ctx, types.NamespacedName{Namespace: Namespace, Name: n.Name}, &l); err != nil {
		return err
	}
	if l.Spec.RenewTime == nil || l.Spec.RenewTime.Time.Before(since) {
		return fmt.Errorf("the Lease of node %s was not renewed since its start", n.Name)
	}
	var fn fbv1.ForkboxNode
	if err := n.c.Plane.Client.Get(ctx, types.NamespacedName{Name: n.Name}, &fn); err != nil {
		return err
	}
	if !kube.IsTrue(fn.Status.Conditions, fbv1.ConditionReady) || fn.Status.Allocatable.Slots != int32(n.Slots) {
		return fmt.Errorf("ForkboxNode %s is not Ready with %d slots: %+v", n.Name, n.Slots, fn.Status.Conditions)
	}
	return nil
}

// Stop stops the node with SIGTERM (its sandboxes keep running) and
// waits for it to exit (SIGKILL after 30s).
func (n *Node) Stop(ctx context.Context) error {
	return n.signal(ctx, syscall.SIGTERM)
}

// Kill SIGKILLs the node process and waits for it to exit; its sandboxes
// keep running.
func (n *Node) Kill(ctx context.Context) error {
	return n.signal(ctx, syscall.SIGKILL)
}

// Restart stops the node (SIGTERM) and starts it again.
func (n *Node) Restart(ctx context.Context) error {
	if err := n.Stop(ctx); err != nil {
		return err
	}
	return n.Start(ctx)
}

func (n *Node) signal(ctx context.Context, sig syscall.Signal) error {
	n.mu.Lock()
	cmd, done := n.cmd, n.done
	running := n.running()
	n.mu.Unlock()
	if !running {
		return nil
	}
	if err := cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("signal node %s: %w", n.Name, err)
	}
	select {
	case <-done:
		return nil
	case <-time.After(30 * time.Second):
	case <-ctx.Done():
	}
	cmd.Process.Kill()
	<-done
	if sig == syscall.SIGKILL {
		return nil
	}
	return fmt.Errorf("node %s did not stop on %s within 30s: killed", n.Name, sig)
}

// uninstall removes the node's host state through its own daemon
// (`forkbox uninstall --purge`, in its namespace): every sandbox is
// closed, its bridge, table, btrfs loop device, mounts and cgroups go.
func (n *Node) uninstall(ctx context.Context) error {
	if _, err := os.Stat(n.StateDir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	cmd := n.inNetns(append([]string{"uninstall", "--purge"}, n.daemonArgs()...)...)
	cmd.SysProcAttr = nil
	out, err := exec.CommandContext(ctx, cmd.Path, cmd.Args[1:]...).CombinedOutput()
	// Into the node's log too, for the audit that may follow (Cluster.Close).
	if f, ferr := os.OpenFile(n.LogPath(), os.O_APPEND|os.O_WRONLY, 0); ferr == nil {
		fmt.Fprintf(f, "---- uninstall ----\n%s", out)
		f.Close()
	}
	if err != nil {
		return fmt.Errorf("uninstall node %s: %v\n%s", n.Name, err, tail(out, 4000))
	}
	return nil
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}
