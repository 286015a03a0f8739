// Package e2e tests forkbox end to end: a real `forkbox serve` process (real
// runsc, btrfs on a loop device, network namespaces, nftables, cgroups)
// driven through the Go SDK and the CLI. It needs root; outside CI a missing
// prerequisite skips the suite, in CI (CI=true) it fails it.
package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/internal/mount"
	"github.com/forkbox/forkbox/internal/network"
	"github.com/forkbox/forkbox/internal/snapshot/btrfs"
	"github.com/forkbox/forkbox/internal/testimage"
)

// env is the daemon and image every test shares.
var env struct {
	dir      string // everything of this run lives below
	bin      string // forkbox binary
	agent    string
	stateDir string
	runDir   string
	socket   string
	daemon   *exec.Cmd
	logFile  *os.File
	image    string // busybox image name
	c        *client.Client
	extra    []string // extra serve flags
}

// The host names of this run carry a random suffix, so that two runs on
// one host (two developers, or a run beside CI) never touch each other's
// bridge, nftables table, veths, subnet or cgroups.
var (
	runID        = fmt.Sprintf("%04x", os.Getpid()&0xffff)
	bridge       = "fbxe2e" + runID
	netTable     = "forkbox_e2e_" + runID
	vethPrefix   = "e" + runID
	third        = freeThird(os.Getpid(), network.HostRoutes())
	subnet       = fmt.Sprintf("10.213.%d.0/24", third)
	gateway      = fmt.Sprintf("10.213.%d.1", third)
	cgroupParent = "forkbox-e2e-" + runID
)

// freeThird picks the third octet of this run's subnets (10.213.x.0/24
// for sandboxes, 10.249.x and 10.250.x for the egress test's fake
// outside): the first from 100+pid%150 on whose subnets no route of the
// host overlaps. By the pid alone, two runs on one host shared a subnet
// one time in 150, and each one's sandboxes reached the other's.
func freeThird(pid int, routes []netip.Prefix) int {
	for i := range 150 {
		t := 100 + (pid+i)%150
		free := true
		for _, second := range []byte{213, 249, 250} {
			p := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, second, byte(t), 0}), 24)
			free = free && !slices.ContainsFunc(routes, p.Overlaps)
		}
		if free {
			return t
		}
	}
	return 100 + pid%150
}

// prerequisites says what this machine lacks for the suite, or "".
func prerequisites() string {
	if os.Geteuid() != 0 {
		return "needs root"
	}
	for _, bin := range []string{"runsc", "mkfs.btrfs"} {
		if _, err := exec.LookPath(bin); err != nil {
			return bin + " is not installed (run ./scripts/setup.sh)"
		}
	}
	if err := testimage.Available(); err != nil {
		return err.Error()
	}
	return ""
}

func TestMain(m *testing.M) {
	if why := prerequisites(); why != "" {
		if os.Getenv("CI") == "true" {
			fmt.Fprintln(os.Stderr, "e2e: FAIL: prerequisite missing in CI:", why)
			os.Exit(1)
		}
		fmt.Fprintln(os.Stderr, "e2e: skipping:", why)
		os.Exit(0)
	}
	code, err := run(m)
	if err == nil {
		err = forwardingLeft()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}

// forwardingLeft reports this run's hold on the host's IPv4 forwarding if
// it outlived the cleanup: the host's ip_forward would stay on.
func forwardingLeft() error {
	holder := network.ForwardHolder(netTable)
	if _, err := os.Lstat(holder); err == nil {
		return fmt.Errorf("left behind: the forwarding holder %s (the host's ip_forward stays on)", holder)
	}
	return nil
}

func run(m *testing.M) (int, error) {
	dir, err := os.MkdirTemp("", "forkbox-e2e-")
	if err != nil {
		return 1, err
	}
	env.dir = dir
	env.stateDir = filepath.Join(dir, "state")
	env.runDir = filepath.Join(dir, "run")
	env.socket = filepath.Join(dir, "forkbox.sock")
	env.bin = filepath.Join(dir, "forkbox")
	env.agent = filepath.Join(dir, "forkbox-agent")
	defer cleanupHost()
	for bin, pkg := range map[string]string{env.bin: "../cmd/forkbox", env.agent: "../cmd/forkbox-agent"} {
		cmd := exec.Command("go", "build", "-o", bin, pkg)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			return 1, fmt.Errorf("build %s: %v\n%s", pkg, err, out)
		}
	}
	if env.logFile, err = os.Create(filepath.Join(dir, "daemon.log")); err != nil {
		return 1, err
	}
	if err := startDaemon(); err != nil {
		log, _ := os.ReadFile(env.logFile.Name())
		return 1, fmt.Errorf("%w\n---- daemon log ----\n%s", err, tail(log, 4096))
	}
	env.c = &client.Client{Socket: env.socket}
	img, err := testimage.Busybox()
	if err != nil {
		return 1, err
	}
	archive := filepath.Join(dir, "busybox.tar")
	if err := testimage.WriteOCIArchive(img, "e2e.local/busybox:latest", archive); err != nil {
		return 1, err
	}
	ctx := context.Background()
	im, err := env.c.ImportImage(ctx, archive, "", nil)
	if err != nil {
		return 1, fmt.Errorf("import busybox: %w", err)
	}
	env.image = im.Name
	code := m.Run()
	if code != 0 {
		log, _ := os.ReadFile(env.logFile.Name())
		fmt.Fprintf(os.Stderr, "---- daemon log (last 4 KiB) ----\n%s\n", tail(log, 4096))
	}
	return code, stopDaemon(syscall.SIGTERM)
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// startDaemon starts `forkbox serve` and waits for its socket to answer.
func startDaemon() error {
	args := append([]string{"serve", "--state-dir", env.stateDir, "--run-dir", env.runDir, "--socket", env.socket,
		"--agent", env.agent, "--bridge", bridge, "--net-table", netTable, "--veth-prefix", vethPrefix,
		"--subnet", subnet, "--cgroup-parent", cgroupParent, "--btrfs-size", "8Gi", "--log-level", "debug",
		// The suite's daemon has no pre-booted sandboxes (their tests,
		// preboot_test.go, turn them on): its tests count and time what
		// they make.
		"--preboot", "0"}, env.extra...)
	// FORKBOX_E2E_RUNSC runs the suite with another runsc binary (e.g. one
	// built with scripts/gvisor/memory-limit.patch); flags a test adds
	// after it (withDaemonFlags) still win.
	if bin := os.Getenv("FORKBOX_E2E_RUNSC"); bin != "" {
		args = append(args[:1], append([]string{"--runsc", bin}, args[1:]...)...)
	}
	cmd := exec.Command(env.bin, args...)
	cmd.Stdout, cmd.Stderr = env.logFile, env.logFile
	if err := cmd.Start(); err != nil {
		return err
	}
	env.daemon = cmd
	c := &client.Client{Socket: env.socket}
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		if _, err := c.ListSandboxes(context.Background(), false); err == nil {
			return nil
		}
		if err := cmd.Process.Signal(syscall.Signal(0)); err != nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	log, _ := os.ReadFile(env.logFile.Name())
	return fmt.Errorf("daemon did not answer on %s (%s)\n---- daemon log (end) ----\n%s", env.socket, env.logFile.Name(), tail(log, 3000))
}

// stopDaemon stops the daemon with sig and waits for it to exit.
func stopDaemon(sig syscall.Signal) error {
	if env.daemon == nil {
		return nil
	}
	env.daemon.Process.Signal(sig)
	err := env.daemon.Wait()
	env.daemon = nil
	if sig == syscall.SIGKILL {
		return nil
	}
	return err
}

// restartDaemon stops the daemon with sig and starts it again.
func restartDaemon(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := stopDaemon(sig); err != nil {
		t.Fatalf("daemon exit: %v", err)
	}
	if err := startDaemon(); err != nil {
		t.Fatal(err)
	}
}

// cleanupHost removes every sandbox and the host state of this run: the
// daemon's btrfs loop device, its bridge and nftables tables.
func cleanupHost() {
	ctx := context.Background()
	if env.daemon == nil && env.logFile != nil {
		// A test left the daemon dead: a fresh start reconciles, then
		// everything is closed through it.
		startDaemon()
	}
	if env.daemon != nil {
		c := &client.Client{Socket: env.socket}
		list, _ := c.ListSandboxes(ctx, false)
		for _, s := range list {
			if sb, err := c.Sandbox(ctx, s.Id); err == nil {
				sb.Close(ctx)
			}
		}
		stopDaemon(syscall.SIGTERM)
	}
	if err := btrfs.Detach(ctx, filepath.Join(env.stateDir, "snapshots")); err != nil {
		fmt.Fprintln(os.Stderr, "e2e: detach btrfs:", err)
	}
	if m, err := network.New(ctx, network.Config{Bridge: bridge, Table: netTable, VethPrefix: vethPrefix,
		NetnsDir: filepath.Join(env.runDir, "netns")}); err == nil {
		if err := m.Destroy(ctx); err != nil {
			fmt.Fprintln(os.Stderr, "e2e: destroy the network:", err)
		}
	} else {
		fmt.Fprintln(os.Stderr, "e2e: the network's manager:", err)
	}
	// Whatever happened above, this run's hold on the host's IPv4
	// forwarding goes (the last holder restores the host's value).
	if err := network.ReleaseForwarding(netTable, nil); err != nil {
		fmt.Fprintln(os.Stderr, "e2e: release forwarding:", err)
	}
	// Last resort for a run that crashed: nothing of this run may outlive it.
	exec.Command("pkill", "-9", "-f", env.dir).Run()
	if mps, err := mount.Under(env.dir); err == nil {
		for _, mp := range mps {
			mount.Unmount(ctx, mp)
		}
	}
	for _, dir := range cgroupDirs() {
		os.Remove(dir)
	}
	os.RemoveAll(env.dir)
}

// newSandbox creates a sandbox that the test closes at its end.
func newSandbox(t *testing.T, o client.CreateOptions) *client.Sandbox {
	t.Helper()
	if o.Image == "" {
		o.Image = env.image
	}
	sb, err := env.c.CreateSandbox(context.Background(), o)
	if err != nil {
		t.Fatalf("create sandbox: %v", err)
	}
	t.Cleanup(func() { sb.Close(context.Background()) })
	return sb
}

// sh runs a shell command in sb and returns stdout, stderr and the result.
func sh(t *testing.T, sb *client.Sandbox, cmd string) (string, string, *client.ExecResult) {
	t.Helper()
	var out, errb strings.Builder
	res, err := sb.Exec(context.Background(), client.ExecOptions{Shell: cmd, Stdout: &out, Stderr: &errb})
	if err != nil {
		t.Fatalf("exec %q: %v", cmd, err)
	}
	return out.String(), errb.String(), res
}

// mustSh runs cmd and fails the test unless it exits 0.
func mustSh(t *testing.T, sb *client.Sandbox, cmd string) string {
	t.Helper()
	out, errs, res := sh(t, sb, cmd)
	if res.ExitCode != 0 {
		t.Fatalf("exec %q: exit %d, stderr %q", cmd, res.ExitCode, errs)
	}
	return out
}

// cgroupDirs lists this run's cgroup directories, children first.
func cgroupDirs() []string {
	kids, _ := filepath.Glob("/sys/fs/cgroup/*/" + cgroupParent + "/*")
	parents, _ := filepath.Glob("/sys/fs/cgroup/*/" + cgroupParent)
	var out []string
	for _, k := range kids {
		if st, err := os.Stat(k); err == nil && st.IsDir() {
			out = append(out, k)
		}
	}
	return append(out, parents...)
}

// withDaemonFlags restarts the daemon with extra serve flags for the rest of
// the test, and with the usual ones after it.
func withDaemonFlags(t *testing.T, flags ...string) {
	t.Helper()
	env.extra = flags
	restartDaemon(t, syscall.SIGTERM)
	t.Cleanup(func() {
		env.extra = nil
		restartDaemon(t, syscall.SIGTERM)
	})
}
