package network

import (
	"bytes"
	"context"
	"net"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// A sandbox's address is pinned on the bridge while it lives: a permanent
// neighbour entry to its eth0's MAC (never collected, so the host does not
// broadcast ARP requests that wake every sandbox once the dynamic entries
// pass gc_thresh2) and a static forwarding entry on its port (no flooding
// when a quiet sandbox's learned entry would have aged out). Traffic keeps
// it permanent, and teardown removes it.
func TestNeighbourPinned(t *testing.T) {
	m := newTestManager(t, 6)
	a := setup(t, m, "a", EgressNone)
	mac := eth0MAC(t, a.NSPath)

	br, err := netlink.LinkByName(m.cfg.Bridge)
	if err != nil {
		t.Fatal(err)
	}
	pinned := func() *netlink.Neigh {
		t.Helper()
		ns, err := netlink.NeighList(br.Attrs().Index, netlink.FAMILY_V4)
		if err != nil {
			t.Fatal(err)
		}
		for i := range ns {
			if ns[i].IP.Equal(net.IP(a.IP.AsSlice())) {
				return &ns[i]
			}
		}
		return nil
	}
	check := func(when string) {
		t.Helper()
		n := pinned()
		if n == nil || n.State&netlink.NUD_PERMANENT == 0 || !bytes.Equal(n.HardwareAddr, mac) {
			t.Fatalf("%s: the bridge's neighbour entry of %s: got %+v, want permanent, to %s", when, a.IP, n, mac)
		}
	}
	check("after setup")
	port, err := netlink.LinkByName(a.HostVeth)
	if err != nil {
		t.Fatal(err)
	}
	fdb, err := netlink.NeighList(port.Attrs().Index, unix.AF_BRIDGE)
	if err != nil {
		t.Fatal(err)
	}
	static := false
	for _, e := range fdb {
		static = static || bytes.Equal(e.HardwareAddr, mac) && e.State&netlink.NUD_NOARP != 0
	}
	if !static {
		t.Errorf("the forwarding entries of port %s: got %+v, want %s static", a.HostVeth, fdb, mac)
	}

	listenIn(t, a.NSPath, net.JoinHostPort(a.IP.String(), "7077"))
	if err := dial("", net.JoinHostPort(a.IP.String(), "7077")); err != nil {
		t.Fatalf("host -> sandbox: %v", err)
	}
	check("after traffic")

	// Reconfigure (a sandbox restored into its netns) pins it again.
	if err := m.Reconfigure(context.Background(), a.ID, a.IP); err != nil {
		t.Fatalf("Reconfigure: %v", err)
	}
	check("after Reconfigure")

	if err := m.Teardown(context.Background(), a.ID); err != nil {
		t.Fatalf("Teardown: %v", err)
	}
	if n := pinned(); n != nil {
		t.Errorf("after teardown: the bridge still has %+v", n)
	}
}

// eth0MAC is the MAC of eth0 in the netns at path.
func eth0MAC(t *testing.T, path string) net.HardwareAddr {
	t.Helper()
	eth, err := nsHandle(t, path).LinkByName(peerName)
	if err != nil {
		t.Fatal(err)
	}
	return eth.Attrs().HardwareAddr
}

// nsHandle is a netlink handle in the netns at path, closed when the test
// ends.
func nsHandle(t *testing.T, path string) *netlink.Handle {
	t.Helper()
	ns, err := netns.GetFromPath(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return h
}
