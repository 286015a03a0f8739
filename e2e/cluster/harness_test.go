package cluster

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"

	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
)

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// The harness itself: each node has its own address, reached from the
// host and from the other nodes' namespaces with the cluster's token; a
// node killed and started again answers again; the leak audit sees
// every kind of host object of a live cluster (so an empty audit after
// the suite means something).
func TestHarnessNodes(t *testing.T) {
	needNodes(t, 2)
	ctx := context.Background()
	seen := map[string]bool{}
	for _, n := range nodes() {
		if seen[n.Endpoint] || seen[n.NetNS] {
			t.Fatalf("node %s shares endpoint %s or netns %s with another node", n.Name, n.Endpoint, n.NetNS)
		}
		seen[n.Endpoint], seen[n.NetNS] = true, true
		if _, err := n.TCPClient().ListSandboxes(ctx, false); err != nil {
			t.Fatalf("node %s at %s from the host: %v", n.Name, n.Endpoint, err)
		}
	}
	// From node 0's namespace to node 1's endpoint, as another host would.
	a, b := node(0), node(1)
	out, err := exec.Command("nsenter", "--net=/run/netns/"+a.NetNS, "--", cl.Bin, "ls",
		"--host", "http://"+b.Endpoint, "--token", cl.Token).CombinedOutput()
	if err != nil {
		t.Fatalf("node %s → %s: %v\n%s", a.Name, b.Endpoint, err, out)
	}
	// Without the token the endpoint refuses.
	if out, err := exec.Command("nsenter", "--net=/run/netns/"+a.NetNS, "--", cl.Bin, "ls",
		"--host", "http://"+b.Endpoint, "--token", "wrong").CombinedOutput(); err == nil {
		t.Fatalf("node %s's endpoint answered a wrong token: %s", b.Name, out)
	}

	keepRunning(t)
	pid := b.Pid()
	if err := b.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	if b.Running() || b.Pid() != 0 {
		t.Fatalf("node %s still running after Kill", b.Name)
	}
	if _, err := b.Client.ListSandboxes(ctx, false); err == nil {
		t.Fatalf("node %s's daemon answers after Kill", b.Name)
	}
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if b.Pid() == pid || b.Pid() == 0 {
		t.Fatalf("node %s: pid %d after restart, was %d", b.Name, b.Pid(), pid)
	}

	// A sandbox with egress switches IPv4 forwarding on in its node's
	// namespace only; the node's record of it is its namespace's, which
	// its uninstall removes at the end (the audit after the suite).
	hostFwd := readFile(t, "/proc/sys/net/ipv4/ip_forward")
	ns := testNamespace(t)
	sb := newSandbox(ns, "egress", a.Name, fbv1.RuntimeCrun)
	sb.Spec.Egress = &fbv1.Egress{Mode: "all"}
	create(t, sb)
	running(t, sb, fbv1.PhaseRunning)
	if out, err := exec.Command("nsenter", "--net=/run/netns/"+a.NetNS, "--", "cat", "/proc/sys/net/ipv4/ip_forward").Output(); err != nil || string(out) != "1\n" {
		t.Fatalf("ip_forward in %s: %q, %v; want 1", a.NetNS, out, err)
	}
	if got := readFile(t, "/proc/sys/net/ipv4/ip_forward"); got != hostFwd {
		t.Fatalf("the host's ip_forward changed from %q to %q", hostFwd, got)
	}

	leaks := strings.Join(cl.Leaks(), "\n")
	for _, want := range []string{"mount: ", "loop device: ", "process ", "netns: ", "link: ", "directory: ", "forwarding record: "} {
		if !strings.Contains(leaks, want) {
			t.Errorf("the audit of a live cluster has no %q entry; got:\n%s", want, leaks)
		}
	}
}
