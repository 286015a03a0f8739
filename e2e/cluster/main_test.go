// Package cluster tests cluster mode end to end: a real kube-apiserver and
// etcd (envtest, KUBEBUILDER_ASSETS), `forkbox controller` and one
// `forkbox serve --cluster` node agent as processes, each with a
// kubeconfig of a user bound only to its ClusterRole from deploy/rbac,
// and the node's real daemon (runsc, crun, btrfs, netns, nftables). It
// needs root; outside CI a missing prerequisite skips it, in CI
// (CI=true) it fails.
package cluster

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/internal/cluster/clustertest"
	"github.com/forkbox/forkbox/internal/network"
	"github.com/forkbox/forkbox/internal/snapshot/btrfs"
	"github.com/forkbox/forkbox/internal/testimage"
)

var plane clustertest.Plane

// env is what every test shares.
var env struct {
	dir, bin, agent, stateDir, runDir, socket string
	node                                      string
	procs                                     []*exec.Cmd // controller, node agent
	c                                         *client.Client
	image                                     string
	skip                                      string
}

var (
	runID        = fmt.Sprintf("%04x", os.Getpid()&0xffff)
	bridge       = "fbxcl" + runID
	netTable     = "forkbox_cl_" + runID
	vethPrefix   = "c" + runID
	third        = 100 + os.Getpid()%150
	subnet       = fmt.Sprintf("10.214.%d.0/24", third)
	cgroupParent = "forkbox-cl-" + runID
)

func prerequisites() string {
	if os.Geteuid() != 0 {
		return "needs root"
	}
	for _, bin := range []string{"runsc", "crun", "mkfs.btrfs"} {
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

// suite wraps the package's tests with the node's processes, started
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

func run(m *testing.M) (int, error) {
	dir, err := os.MkdirTemp("", "forkbox-cluster-e2e-")
	if err != nil {
		return 1, err
	}
	env.dir, env.node = dir, "node-"+runID
	env.stateDir, env.runDir = filepath.Join(dir, "state"), filepath.Join(dir, "run")
	env.socket = filepath.Join(dir, "forkbox.sock")
	env.bin, env.agent = filepath.Join(dir, "forkbox"), filepath.Join(dir, "forkbox-agent")
	defer cleanup()
	for bin, pkg := range map[string]string{env.bin: "../../cmd/forkbox", env.agent: "../../cmd/forkbox-agent"} {
		cmd := exec.Command("go", "build", "-o", bin, pkg)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			return 1, fmt.Errorf("build %s: %v\n%s", pkg, err, out)
		}
	}
	ctrlCfg, err := kubeconfigFor("forkbox-controller", "../../deploy/rbac/controller/role.yaml")
	if err != nil {
		return 1, err
	}
	nodeCfg, err := kubeconfigFor("forkbox-node", "../../deploy/rbac/node/role.yaml")
	if err != nil {
		return 1, err
	}
	if err := start("controller", "controller", "--kubeconfig", ctrlCfg, "--namespace", clustertest.Namespace, "--log-level", "debug"); err != nil {
		return 1, err
	}
	if err := start("node", append([]string{"serve", "--cluster", "--node-name", env.node, "--kubeconfig", nodeCfg,
		"--cluster-namespace", clustertest.Namespace, "--lease-duration", "6s", "--node-endpoint", "127.0.0.1:0",
		"--state-dir", env.stateDir, "--run-dir", env.runDir, "--socket", env.socket,
		"--agent", env.agent, "--bridge", bridge, "--net-table", netTable, "--veth-prefix", vethPrefix,
		"--subnet", subnet, "--cgroup-parent", cgroupParent, "--btrfs-size", "4Gi", "--log-level", "debug"},
		nodeAPIArgs()...)...); err != nil { // nodeAPIArgs: gateway_test.go
		return 1, err
	}
	env.c = &client.Client{Socket: env.socket}
	if err := waitFor(60*time.Second, func() error { _, err := env.c.ListSandboxes(context.Background(), false); return err }); err != nil {
		return 1, fmt.Errorf("the node's daemon did not answer on %s: %w", env.socket, err)
	}
	img, err := testimage.Busybox()
	if err != nil {
		return 1, err
	}
	archive := filepath.Join(dir, "busybox.tar")
	if err := testimage.WriteOCIArchive(img, "e2e.local/busybox:latest", archive); err != nil {
		return 1, err
	}
	im, err := env.c.ImportImage(context.Background(), archive, "", nil)
	if err != nil {
		return 1, fmt.Errorf("import busybox: %w", err)
	}
	env.image = im.Name
	code := m.Run()
	if code != 0 {
		for _, name := range []string{"controller", "node"} {
			b, _ := os.ReadFile(filepath.Join(dir, name+".log"))
			if len(b) > 6000 {
				b = b[len(b)-6000:]
			}
			fmt.Fprintf(os.Stderr, "---- %s log (end) ----\n%s\n", name, b)
		}
	}
	return code, nil
}

// kubeconfigFor provisions a user bound to the ClusterRole in rolePath
// (and nothing else) and writes its kubeconfig file.
func kubeconfigFor(name, rolePath string) (string, error) {
	ctx := context.Background()
	b, err := os.ReadFile(rolePath)
	if err != nil {
		return "", err
	}
	var role rbacv1.ClusterRole
	if err := yaml.Unmarshal(b, &role); err != nil {
		return "", fmt.Errorf("%s: %w", rolePath, err)
	}
	c := plane.Client
	if err := c.Create(ctx, &role); err != nil {
		return "", err
	}
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: role.Name},
		Subjects: []rbacv1.Subject{{Kind: "User", APIGroup: "rbac.authorization.k8s.io", Name: name}}}
	if err := c.Create(ctx, binding); err != nil {
		return "", err
	}
	u, err := plane.Env.AddUser(envtest.User{Name: name}, nil)
	if err != nil {
		return "", err
	}
	kc, err := u.KubeConfig()
	if err != nil {
		return "", err
	}
	path := filepath.Join(env.dir, name+".kubeconfig")
	return path, os.WriteFile(path, kc, 0o600)
}

// start starts the forkbox binary with args, logging to DIR/name.log.
func start(name string, args ...string) error {
	log, err := os.Create(filepath.Join(env.dir, name+".log"))
	if err != nil {
		return err
	}
	cmd := exec.Command(env.bin, args...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		return err
	}
	env.procs = append(env.procs, cmd)
	return nil
}

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

// cleanup stops the processes this run started (the node agent last, so
// it closes the sandboxes the tests deleted), then removes the node's
// host state.
func cleanup() {
	ctx := context.Background()
	if env.c != nil {
		list, _ := env.c.ListSandboxes(ctx, false)
		for _, s := range list {
			if sb, err := env.c.Sandbox(ctx, s.Id); err == nil {
				sb.Close(ctx)
			}
		}
	}
	for i := len(env.procs) - 1; i >= 0; i-- {
		p := env.procs[i]
		p.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { p.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			p.Process.Kill()
			<-done
		}
	}
	if err := btrfs.Detach(ctx, filepath.Join(env.stateDir, "snapshots")); err != nil {
		fmt.Fprintln(os.Stderr, "e2e/cluster: detach btrfs:", err)
	}
	if m, err := network.New(ctx, network.Config{Bridge: bridge, Table: netTable, VethPrefix: vethPrefix,
		NetnsDir: filepath.Join(env.runDir, "netns")}); err == nil {
		m.Destroy(ctx)
	}
	kids, _ := filepath.Glob("/sys/fs/cgroup/*/" + cgroupParent + "/*")
	parents, _ := filepath.Glob("/sys/fs/cgroup/*/" + cgroupParent)
	for _, d := range append(kids, parents...) {
		if st, err := os.Stat(d); err == nil && st.IsDir() {
			os.Remove(d)
		}
	}
	os.RemoveAll(env.dir)
}

// need skips t when this machine cannot run the suite.
func need(t *testing.T) {
	t.Helper()
	plane.Need(t)
	if env.skip != "" {
		t.Skip(env.skip)
	}
}
