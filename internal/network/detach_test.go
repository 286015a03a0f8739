package network

import (
	"bytes"
	"context"
	"net"
	"os"
	"testing"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/vishvananda/netlink"
)

// A hibernated sandbox gives its bridge port back (a bridge has
// MaxBridgePorts, and 10,000 hibernated sessions must not hold one each):
// Detach removes its veth pair and its address's pin, and keeps its netns,
// egress policy and elements (Teardown finds the policy by them); Attach plugs it in again, as
// itself: reachable at its address, pinned to the new eth0's MAC, its
// elements back for its egress mode. Both are idempotent, and Attach on a
// sandbox still attached (a crash between the two) plugs it in afresh.
func TestDetachAttach(t *testing.T) {
	m := newTestManager(t, 29)
	ctx := context.Background()
	pol := Policy{Mode: EgressAll}
	a := setupWith(t, m, "a", pol)
	ports := func() int {
		t.Helper()
		br, err := netlink.LinkByName(m.cfg.Bridge)
		if err != nil {
			t.Fatal(err)
		}
		links, err := netlink.LinkList()
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, l := range links {
			if l.Attrs().MasterIndex == br.Attrs().Index {
				n++
			}
		}
		return n
	}
	pinnedTo := func() net.HardwareAddr {
		t.Helper()
		br, _ := netlink.LinkByName(m.cfg.Bridge)
		ns, err := netlink.NeighList(br.Attrs().Index, netlink.FAMILY_V4)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range ns {
			if n.IP.Equal(net.IP(a.IP.AsSlice())) && n.State&netlink.NUD_PERMANENT != 0 {
				return n.HardwareAddr
			}
		}
		return nil
	}
	if got := ports(); got != 1 {
		t.Fatalf("bridge ports after setup: %d, want 1", got)
	}

	for i := range 2 {
		if err := m.Detach(ctx, a.ID, a.IP); err != nil {
			t.Fatalf("Detach #%d: %v", i+1, err)
		}
	}
	if got := ports(); got != 0 {
		t.Errorf("bridge ports after Detach: %d, want 0", got)
	}
	if _, err := netlink.LinkByName(a.HostVeth); !isNotFound(err) {
		t.Errorf("veth %s after Detach: err %v, want not found", a.HostVeth, err)
	}
	if _, err := os.Stat(a.NSPath); err != nil {
		t.Errorf("netns after Detach: %v, want kept", err)
	}
	if els := m.setElements(t, m.portsSet()); !els[a.HostVeth+"/"+a.IP.String()] {
		t.Errorf("ports set after Detach: %v, want %s/%s kept (how Teardown finds the address)", els, a.HostVeth, a.IP)
	}
	if mac := pinnedTo(); mac != nil {
		t.Errorf("after Detach the bridge still pins %s to %s", a.IP, mac)
	}
	if _, kept := m.applied[a.IP]; !kept {
		t.Errorf("egress policy of %s after Detach: gone, want kept", a.IP)
	}

	// Attach twice: the second finds it attached and plugs it in afresh.
	for i := range 2 {
		if err := m.Attach(ctx, a.ID, a.IP, pol); err != nil {
			t.Fatalf("Attach #%d: %v", i+1, err)
		}
		if got := ports(); got != 1 {
			t.Errorf("bridge ports after Attach #%d: %d, want 1", i+1, got)
		}
		if mac, want := pinnedTo(), eth0MAC(t, a.NSPath); !bytes.Equal(mac, want) {
			t.Errorf("after Attach #%d the bridge pins %s to %s, want eth0's %s", i+1, a.IP, mac, want)
		}
		if els := m.setElements(t, m.portsSet()); !els[a.HostVeth+"/"+a.IP.String()] {
			t.Errorf("ports set after Attach #%d: %v, want %s/%s", i+1, els, a.HostVeth, a.IP)
		}
		if els := m.setElements(t, m.egressAllSet()); !els[a.IP.String()] {
			t.Errorf("egress_all after Attach #%d: %v, want %s (egress all)", i+1, els, a.IP)
		}
	}
	listenIn(t, a.NSPath, net.JoinHostPort(a.IP.String(), "7077"))
	if err := dial("", net.JoinHostPort(a.IP.String(), "7077")); err != nil {
		t.Fatalf("host -> sandbox after Attach: %v", err)
	}

	// Teardown of a detached sandbox leaves nothing, its policy included.
	if err := m.Detach(ctx, a.ID, a.IP); err != nil {
		t.Fatal(err)
	}
	if err := m.Teardown(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	m.assertGone(t, a.ID)
	if _, kept := m.applied[a.IP]; kept {
		t.Errorf("egress policy of %s after Teardown: kept, want gone", a.IP)
	}
	if err := m.Attach(ctx, a.ID, a.IP, pol); !errdefs.IsNotFound(err) {
		t.Errorf("Attach after Teardown: got %v, want NotFound (no netns)", err)
	}
}
