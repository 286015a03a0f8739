package network

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"testing"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/vishvananda/netlink"
)

// A Linux bridge takes MaxBridgePorts ports: a sandbox past that (found by
// the density run, 900 hibernated and 123 running) is ResourceExhausted,
// naming the bridge and the limit, not an Internal "exchange full", and
// leaves nothing behind. A detached (hibernated) sandbox holds no port,
// and cannot attach to a full bridge.
func TestBridgeFull(t *testing.T) {
	m := newTestManagerIn(t, 28, netip.MustParsePrefix("10.232.0.0/16"))
	br, err := netlink.LinkByName(m.cfg.Bridge)
	if err != nil {
		t.Fatal(err)
	}
	// A hibernated sandbox holds no port: it is in no count below.
	hib := setupWith(t, m, "hib", Policy{Mode: EgressNone})
	if err := m.Detach(context.Background(), hib.ID, hib.IP); err != nil {
		t.Fatal(err)
	}
	// Fill the bridge with plain veth ports (a sandbox's Setup each would
	// take minutes): the last one must fail as a sandbox would.
	var made []string
	t.Cleanup(func() {
		for _, n := range made {
			delVeth(n)
		}
	})
	for i := range MaxBridgePorts {
		name := fmt.Sprintf("f%d-%d", os.Getpid()%10000, i)
		err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name, MasterIndex: br.Attrs().Index}, PeerName: name + "p"})
		if err != nil {
			t.Fatalf("port %d of %d: %v", i+1, MaxBridgePorts, err)
		}
		made = append(made, name)
	}
	// addVeth itself cleans up: with the netns held open (so its
	// destruction cannot remove the pair behind our back), the half-made
	// veth must already be gone when the error returns.
	ns := testNetns(t, m.NSPath(testID("held")))
	host := m.hostVethName(testID("held"))
	if err := m.addVeth(testID("held"), host, ns); !errdefs.IsResourceExhausted(err) {
		t.Fatalf("addVeth on a full bridge: got %v, want ResourceExhausted", err)
	}
	if _, err := netlink.LinkByName(host); !isNotFound(err) {
		t.Fatalf("veth %s after a failed attach: err %v, want not found", host, err)
	}
	ip := netip.MustParseAddr("10.232.7.7")
	_, err = m.Setup(context.Background(), testID("full"), ip, Policy{Mode: EgressNone})
	if !errdefs.IsResourceExhausted(err) || !strings.Contains(err.Error(), m.cfg.Bridge) || !strings.Contains(err.Error(), "1023") {
		t.Fatalf("Setup on a full bridge: got %v, want ResourceExhausted naming %s and the limit", err, m.cfg.Bridge)
	}
	m.assertGone(t, testID("full"))
	// A free port takes a sandbox again.
	delVeth(made[len(made)-1])
	made = made[:len(made)-1]
	nw, err := m.Setup(context.Background(), testID("full"), ip, Policy{Mode: EgressNone})
	if err != nil {
		t.Fatalf("Setup after a port is freed: %v", err)
	}
	// Full again: the hibernated one cannot wake into it, and is left
	// detached as it was (no veth, no netns mounted, its place kept);
	// with a port free it can.
	if err := m.Attach(context.Background(), hib.ID, hib.IP, hib.Egress); !errdefs.IsResourceExhausted(err) {
		t.Fatalf("Attach on a full bridge: got %v, want ResourceExhausted", err)
	}
	if _, err := netlink.LinkByName(hib.HostVeth); !isNotFound(err) {
		t.Fatalf("veth %s after a failed Attach: %v, want none", hib.HostVeth, err)
	}
	if mounted, err := netnsMounted(hib.NSPath); err != nil || mounted {
		t.Fatalf("netns after a failed Attach: mounted %v (%v), want its file kept, unmounted", mounted, err)
	}
	if err := m.Teardown(context.Background(), nw.ID); err != nil {
		t.Fatal(err)
	}
	if err := m.Attach(context.Background(), hib.ID, hib.IP, hib.Egress); err != nil {
		t.Fatalf("Attach with a port free: %v", err)
	}
}
