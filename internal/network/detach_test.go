package network

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/mount"
)

// A hibernated sandbox gives back all it holds on the host but its
// address (a bridge has MaxBridgePorts, and every mount on the host is
// copied into each new mount namespace: 10,000 hibernated sessions must
// hold neither a port nor a mount each): Detach deletes its veth pair and
// unmounts its netns, keeping the netns file (its place), its egress policy
// and elements; its address's pin goes and a blackhole route keeps
// traffic to it off the bridge. Attach makes its network again, as itself:
// reachable at its address, pinned to its new eth0, unblocked. Both are
// idempotent; Attach on a sandbox still attached (a crash between the two)
// is fine; Teardown of a detached one leaves nothing.
func TestDetachAttach(t *testing.T) {
	m := newTestManager(t, 29)
	ctx := context.Background()
	a := setupWith(t, m, "a", Policy{Mode: EgressAll})
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
	pinned := func() net.HardwareAddr {
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
	blocked := func() bool {
		t.Helper()
		rs, err := netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Dst: ipNet(a.IP, 32), Table: unix.RT_TABLE_MAIN},
			netlink.RT_FILTER_DST|netlink.RT_FILTER_TABLE)
		if err != nil {
			t.Fatal(err)
		}
		return len(rs) == 1 && rs[0].Type == unix.RTN_BLACKHOLE
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
		t.Errorf("veth %s after Detach: %v, want it gone", a.HostVeth, err)
	}
	if _, err := os.Stat(a.NSPath); err != nil {
		t.Errorf("netns file after Detach: %v, want kept", err)
	}
	if mounted, err := netnsMounted(a.NSPath); err != nil || mounted {
		t.Errorf("netns after Detach: mounted %v (%v), want unmounted", mounted, err)
	}
	if mps, err := mount.Under(a.NSPath); err != nil || len(mps) != 0 {
		t.Errorf("mounts on %s after Detach: %v (%v), want none", a.NSPath, mps, err)
	}
	if err := createNetns(a.NSPath); !errdefs.IsAlreadyExists(err) {
		t.Errorf("a new netns on a detached sandbox's place: %v, want AlreadyExists", err)
	}
	if els := m.setElements(t, m.portsSet()); !els[a.HostVeth+"/"+a.IP.String()] {
		t.Errorf("ports set after Detach: %v, want %s/%s kept", els, a.HostVeth, a.IP)
	}
	if got := pinned(); got != nil {
		t.Errorf("after Detach the bridge still pins %s to %s", a.IP, got)
	}
	if !blocked() {
		t.Errorf("after Detach: no blackhole route to %s", a.IP)
	}
	if _, kept := m.applied[a.IP]; !kept {
		t.Errorf("egress policy of %s after Detach: gone, want kept", a.IP)
	}
	// The host's own connects to it fail at once (no ARP broadcast to
	// every port, and a timeout).
	if err := dial("", net.JoinHostPort(a.IP.String(), "7077")); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("host -> detached sandbox: %v, want an error at once (blackhole route)", err)
	}

	// Attach twice: the second finds it attached and attaches it again.
	for i := range 2 {
		if err := m.Attach(ctx, a.ID, a.IP, EgressAll); err != nil {
			t.Fatalf("Attach #%d: %v", i+1, err)
		}
		if got := ports(); got != 1 {
			t.Errorf("bridge ports after Attach #%d: %d, want 1", i+1, got)
		}
		if mac := eth0MAC(t, a.NSPath); !bytes.Equal(pinned(), mac) {
			t.Errorf("after Attach #%d the bridge pins %s to %s, want eth0's, %s", i+1, a.IP, pinned(), mac)
		}
		if blocked() {
			t.Errorf("after Attach #%d: %s still blackholed", i+1, a.IP)
		}
		if els := m.setElements(t, m.egressAllSet()); !els[a.IP.String()] {
			t.Errorf("egress_all after Attach #%d: %v, want %s (egress all)", i+1, els, a.IP)
		}
	}
	listenIn(t, a.NSPath, net.JoinHostPort(a.IP.String(), "7077"))
	if err := dial("", net.JoinHostPort(a.IP.String(), "7077")); err != nil {
		t.Fatalf("host -> sandbox after Attach: %v", err)
	}

	// Teardown of a detached sandbox leaves nothing: veth, elements,
	// policy, route. One cut short while it releases the address keeps the
	// port's elements, so that its retry finds the address again.
	if err := m.Detach(ctx, a.ID, a.IP); err != nil {
		t.Fatal(err)
	}
	cut := errors.New("cut short")
	if err := m.delPortElements(a.HostVeth, func(netip.Addr, bool) error { return cut }); !errors.Is(err, cut) {
		t.Fatalf("delPortElements with a failing release: %v", err)
	}
	if els := m.setElements(t, m.portsSet()); !els[a.HostVeth+"/"+a.IP.String()] || !blocked() {
		t.Fatalf("after a release that failed: ports %v, blackholed %v; want the element and the route kept", els, blocked())
	}
	if err := m.Teardown(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	m.assertGone(t, a.ID)
	if _, kept := m.applied[a.IP]; kept {
		t.Errorf("egress policy of %s after Teardown: kept, want gone", a.IP)
	}
	if blocked() {
		t.Errorf("after Teardown: %s still blackholed", a.IP)
	}
	if err := m.Attach(ctx, a.ID, a.IP, EgressAll); !errdefs.IsNotFound(err) {
		t.Errorf("Attach after Teardown: got %v, want NotFound (no netns)", err)
	}
}

// A veth of that name that is not the sandbox's (a name collision) is
// neither taken off the bridge nor attached.
func TestDetachOthersVeth(t *testing.T) {
	m := newTestManager(t, 30)
	ctx := context.Background()
	a := setupWith(t, m, "a", Policy{Mode: EgressNone})
	if err := netlink.LinkSetAlias(mustLink(t, a.HostVeth), aliasPrefix+"someone-else"); err != nil {
		t.Fatal(err)
	}
	if err := m.Detach(ctx, a.ID, a.IP); err == nil {
		t.Error("Detach of a veth with another sandbox's alias: no error")
	}
	if l := mustLink(t, a.HostVeth); l.Attrs().MasterIndex == 0 {
		t.Error("Detach took another sandbox's veth off the bridge")
	}
	if err := m.Attach(ctx, a.ID, a.IP, EgressNone); err == nil {
		t.Error("Attach onto a veth with another sandbox's alias: no error")
	}
}

// A veth of the sandbox's name with no alias is a pair half made by a
// daemon that died between its creation and its alias: Attach deletes it
// and makes a whole pair (before, every wake failed on it for good), and
// Detach deletes it as the sandbox's.
func TestAttachHalfMadeVeth(t *testing.T) {
	m := newTestManager(t, 33)
	ctx := context.Background()
	a := setupWith(t, m, "a", Policy{Mode: EgressNone})
	halfMake := func() {
		t.Helper()
		v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: a.HostVeth}, PeerName: "fbxhalf33"}
		if err := netlink.LinkAdd(v); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if l, err := netlink.LinkByName("fbxhalf33"); err == nil {
				netlink.LinkDel(l)
			}
		})
	}
	if err := m.Detach(ctx, a.ID, a.IP); err != nil {
		t.Fatal(err)
	}
	halfMake()
	if err := m.Attach(ctx, a.ID, a.IP, EgressNone); err != nil {
		t.Fatalf("Attach over a half-made veth: %v", err)
	}
	if l := mustLink(t, a.HostVeth); l.Attrs().Alias != aliasPrefix+a.ID || l.Attrs().MasterIndex == 0 {
		t.Errorf("after Attach: veth alias %q, master %d; want the sandbox's, on the bridge", l.Attrs().Alias, l.Attrs().MasterIndex)
	}
	if _, err := netlink.LinkByName("fbxhalf33"); err == nil {
		t.Error("the half-made pair's peer is still there")
	}
	if err := m.Detach(ctx, a.ID, a.IP); err != nil {
		t.Fatal(err)
	}
	halfMake()
	if err := m.Detach(ctx, a.ID, a.IP); err != nil {
		t.Fatalf("Detach with a half-made veth: %v", err)
	}
	if _, err := netlink.LinkByName(a.HostVeth); err == nil {
		t.Error("Detach left the half-made veth")
	}
	if err := m.Teardown(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
}

func mustLink(t *testing.T, name string) netlink.Link {
	t.Helper()
	l, err := netlink.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// Destroy (forkbox uninstall) leaves no blackhole route of its subnet,
// hibernated sandboxes' included.
func TestDestroyUnblocks(t *testing.T) {
	m := newTestManager(t, 31)
	ctx := context.Background()
	a := setupWith(t, m, "a", Policy{Mode: EgressNone})
	if err := m.Detach(ctx, a.ID, a.IP); err != nil {
		t.Fatal(err)
	}
	if err := m.Teardown(ctx, a.ID); err != nil { // as uninstall closes it first
		t.Fatal(err)
	}
	if err := blockAddr(a.IP); err != nil { // as a teardown cut short would leave it
		t.Fatal(err)
	}
	if err := m.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	for _, p := range HostRoutes() {
		if p == netip.PrefixFrom(a.IP, 32) {
			t.Errorf("after Destroy: a route to %s is left", a.IP)
		}
	}
}

// BenchmarkDetachAttach: a hibernated sandbox's network, given back and
// taken again (what hibernate and wake add to their own time).
// BenchmarkDetachAttach times a hibernation's network half and a wake's:
// Detach, then Attach, each reported on its own (detach-ms, attach-ms).
func BenchmarkDetachAttach(b *testing.B) {
	m := newTestManager(b, 32)
	ctx := context.Background()
	a := setupWith(b, m, "a", Policy{Mode: EgressNone})
	var detach, attach time.Duration
	for b.Loop() {
		t := time.Now()
		if err := m.Detach(ctx, a.ID, a.IP); err != nil {
			b.Fatal(err)
		}
		detach += time.Since(t)
		t = time.Now()
		if err := m.Attach(ctx, a.ID, a.IP, EgressNone); err != nil {
			b.Fatal(err)
		}
		attach += time.Since(t)
	}
	b.ReportMetric(float64(detach.Microseconds())/1e3/float64(b.N), "detach-ms")
	b.ReportMetric(float64(attach.Microseconds())/1e3/float64(b.N), "attach-ms")
}
