package network

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/vishvananda/netlink"
)

func TestAllocate(t *testing.T) {
	m := &Manager{cfg: Config{Subnet: netip.MustParsePrefix("10.231.9.0/29")}, gateway: netip.MustParseAddr("10.231.9.1")}
	var used []netip.Addr
	for i := 2; i <= 6; i++ {
		got, err := allocateAfter(m.cfg.Subnet, used, netip.Addr{})
		if err != nil {
			t.Fatalf("Allocate #%d: %v", i, err)
		}
		if want := netip.AddrFrom4([4]byte{10, 231, 9, byte(i)}); got != want {
			t.Fatalf("Allocate: got %s, want %s", got, want)
		}
		used = append(used, got)
	}
	if _, err := allocateAfter(m.cfg.Subnet, used, netip.Addr{}); !errdefs.IsResourceExhausted(err) {
		t.Fatalf("Allocate on a full subnet: got %v, want ResourceExhausted", err)
	}
	// A hole is reused first.
	if got, _ := allocateAfter(m.cfg.Subnet, used[1:], netip.Addr{}); got != used[0] {
		t.Fatalf("Allocate with a hole: got %s, want %s", got, used[0])
	}
}

func TestHostToSandbox(t *testing.T) {
	m := newTestManager(t, 1)
	a := setup(t, m, "a", EgressNone)
	if a.Gateway != netip.MustParseAddr("10.231.1.1") || a.PrefixLen != 24 || len(a.HostVeth) > 15 {
		t.Fatalf("unexpected network %+v", a)
	}
	link, err := netlink.LinkByName(a.HostVeth)
	if err != nil {
		t.Fatal(err)
	}
	if pi, err := netlink.LinkGetProtinfo(link); err != nil || !pi.Isolated {
		t.Errorf("bridge port %s: isolated %v (err %v), want true", a.HostVeth, pi.Isolated, err)
	}
	if link.Attrs().MasterIndex == 0 {
		t.Errorf("veth %s has no master, want the bridge", a.HostVeth)
	}
	listenIn(t, a.NSPath, net.JoinHostPort(a.IP.String(), "7077"))
	if err := dial("", net.JoinHostPort(a.IP.String(), "7077")); err != nil {
		t.Fatalf("host -> sandbox:7077: %v", err)
	}
	// Inside, lo is up and the default route goes via the gateway.
	listenIn(t, a.NSPath, "127.0.0.1:7078")
	if err := dial(a.NSPath, "127.0.0.1:7078"); err != nil {
		t.Fatalf("loopback inside the sandbox: %v", err)
	}
}

func TestIsolation(t *testing.T) {
	m := newTestManager(t, 2)
	none := setup(t, m, "none", EgressNone)
	all := setup(t, m, "all", EgressAll)
	other := setup(t, m, "other", EgressNone)

	hostL := listenIn(t, "", net.JoinHostPort(m.Gateway().String(), "0"))
	if err := dial("", hostL.Addr().String()); err != nil {
		t.Fatalf("host -> own bridge address: %v", err)
	}
	otherAddr := net.JoinHostPort(other.IP.String(), "7077")
	listenIn(t, other.NSPath, otherAddr)
	if err := dial("", otherAddr); err != nil {
		t.Fatalf("host -> other sandbox: %v", err)
	}
	for _, from := range []*Network{none, all} {
		if err := dial(from.NSPath, hostL.Addr().String()); err == nil {
			t.Errorf("sandbox (egress %s) -> host bridge address: connected, want blocked", from.Egress)
		} else {
			t.Logf("sandbox (egress %s) -> host bridge address: %v", from.Egress, err)
		}
		if err := dial(from.NSPath, otherAddr); err == nil {
			t.Errorf("sandbox (egress %s) -> other sandbox: connected, want blocked", from.Egress)
		} else {
			t.Logf("sandbox (egress %s) -> other sandbox: %v", from.Egress, err)
		}
	}

	rs := nftTables(t, m.cfg.Table)
	if !strings.Contains(rs, "masquerade") {
		t.Errorf("ruleset has no masquerade rule:\n%s", rs)
	}
	egress := m.setElements(t, m.egressAllSet())
	if !egress[all.IP.String()] || egress[none.IP.String()] || len(egress) != 1 {
		t.Errorf("egress_all = %v, want only %s", egress, all.IP)
	}
	if !forwardingOn(t) {
		t.Errorf("ip_forward is off after an egress all sandbox")
	}
}

func TestAntiSpoof(t *testing.T) {
	m := newTestManager(t, 3)
	a := setup(t, m, "a", EgressNone)
	spoofed := netip.MustParseAddr("10.231.3.200")
	err := inNetns(a.NSPath, func() error {
		eth, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		return netlink.AddrAdd(eth, &netlink.Addr{IPNet: ipNet(spoofed, 24)})
	})
	if err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort(spoofed.String(), "7077")
	listenIn(t, a.NSPath, addr)
	if err := dial("", addr); err == nil {
		t.Fatalf("host -> address the sandbox took without being given it: connected, want dropped")
	}
}

func TestTeardownLeavesNothing(t *testing.T) {
	m := newTestManager(t, 4)
	ctx := context.Background()
	a := setup(t, m, "a", EgressAll)
	if err := m.Teardown(ctx, a.ID); err != nil {
		t.Fatalf("Teardown: %v", err)
	}
	m.assertGone(t, a.ID)
	if err := m.Teardown(ctx, a.ID); err != nil {
		t.Fatalf("second Teardown: %v", err)
	}
	if ids, _ := m.List(ctx); len(ids) != 0 {
		t.Fatalf("List after Teardown: got %v, want none", ids)
	}
}

func TestTeardownAfterDestroy(t *testing.T) {
	m := newTestManager(t, 9)
	ctx := context.Background()
	if err := m.Destroy(ctx); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	if err := m.Teardown(ctx, testID("gone")); err != nil {
		t.Fatalf("Teardown with no tables: %v", err)
	}
}

func TestSetupAlreadyExists(t *testing.T) {
	m := newTestManager(t, 5)
	a := setup(t, m, "a", EgressNone)
	_, err := m.Setup(context.Background(), a.ID, netip.MustParseAddr("10.231.5.9"), Policy{Mode: EgressNone})
	if !errdefs.IsAlreadyExists(err) {
		t.Fatalf("second Setup: got %v, want AlreadyExists", err)
	}
	if err := dial("", net.JoinHostPort(a.IP.String(), "1")); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("first sandbox broken by the failed Setup: %v", err)
	}
}

func TestSetupBadInput(t *testing.T) {
	m := newTestManager(t, 6)
	ctx := context.Background()
	for _, tc := range []struct {
		id     string
		ip     string
		egress Egress
	}{
		{"", "10.231.6.2", EgressNone},
		{"../x", "10.231.6.2", EgressNone},
		{"ok", "10.231.6.1", EgressNone},   // gateway
		{"ok", "10.231.6.255", EgressNone}, // broadcast
		{"ok", "10.231.7.2", EgressNone},   // outside the subnet
		{"ok", "10.231.6.2", "some"},
	} {
		if _, err := m.Setup(ctx, tc.id, netip.MustParseAddr(tc.ip), Policy{Mode: tc.egress}); !errdefs.IsInvalidArgument(err) {
			t.Errorf("Setup(%q, %s, %q): got %v, want InvalidArgument", tc.id, tc.ip, tc.egress, err)
		}
	}
}

func TestSetupUnwinds(t *testing.T) {
	m := newTestManager(t, 7)
	ctx := context.Background()
	for _, at := range []string{"netns", "veth", "inside", "nft", "up"} {
		injected := errors.New("injected")
		stepHook = func(s string) error {
			if s == at {
				return injected
			}
			return nil
		}
		id := testID("unwind-" + at)
		_, err := m.Setup(ctx, id, netip.MustParseAddr("10.231.7.2"), Policy{Mode: EgressAll})
		stepHook = nil
		if !errors.Is(err, injected) {
			t.Fatalf("Setup failing at %s: got %v, want the injected error", at, err)
		}
		m.assertGone(t, id)
	}
}

func TestListFindsOrphanVeth(t *testing.T) {
	m := newTestManager(t, 8)
	ctx := context.Background()
	id := testID("orphan")
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: m.hostVethName(id)}, PeerName: fmt.Sprintf("fbtp%d", os.Getpid())}
	if err := netlink.LinkAdd(veth); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { delVeth(m.hostVethName(id)) })
	link, _ := netlink.LinkByName(m.hostVethName(id))
	if err := netlink.LinkSetAlias(link, aliasPrefix+id); err != nil {
		t.Fatal(err)
	}
	a := setup(t, m, "a", EgressNone)
	ids, err := m.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{a.ID, id}; fmt.Sprint(ids) != fmt.Sprint(want) && fmt.Sprint(ids) != fmt.Sprint([]string{id, a.ID}) {
		t.Fatalf("List: got %v, want %v", ids, want)
	}
	if err := m.Teardown(ctx, id); err != nil {
		t.Fatal(err)
	}
	m.assertGone(t, id)
}

func TestNewIdempotent(t *testing.T) {
	m := newTestManager(t, 10)
	a := setup(t, m, "a", EgressAll)
	// Only this manager's tables: other tests and daemons on the host
	// change theirs meanwhile.
	before := nftTables(t, m.cfg.Table)
	m2, err := New(context.Background(), m.cfg)
	if err != nil {
		t.Fatalf("second New: %v", err)
	}
	defer m2.Close()
	if after := nftTables(t, m.cfg.Table); after != before {
		t.Fatalf("ruleset changed by a second New:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	if err := dial("", net.JoinHostPort(a.IP.String(), "1")); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("sandbox unreachable after a second New: %v", err)
	}
}

func BenchmarkSetupTeardown(b *testing.B) {
	m := newTestManager(b, 11)
	ctx := context.Background()
	ip := netip.MustParseAddr("10.231.11.2")
	id := testID("bench")
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := m.Setup(ctx, id, ip, Policy{Mode: EgressAll}); err != nil {
			b.Fatal(err)
		}
		if err := m.Teardown(ctx, id); err != nil {
			b.Fatal(err)
		}
	}
}

func TestAllocateAfterRoundRobin(t *testing.T) {
	m := &Manager{cfg: Config{Subnet: netip.MustParsePrefix("10.231.9.0/29")}, gateway: netip.MustParseAddr("10.231.9.1")}
	a := func(s string) netip.Addr { return netip.MustParseAddr(s) }
	cases := []struct {
		used []netip.Addr
		last netip.Addr
		want string
	}{
		{nil, netip.Addr{}, "10.231.9.2"},
		{nil, a("10.231.9.2"), "10.231.9.3"}, // .2 was just freed: not reused at once
		{[]netip.Addr{a("10.231.9.3")}, a("10.231.9.2"), "10.231.9.4"},
		{nil, a("10.231.9.6"), "10.231.9.2"}, // wraps around
		{[]netip.Addr{a("10.231.9.2")}, a("10.231.9.6"), "10.231.9.3"},
	}
	for _, c := range cases {
		got, err := allocateAfter(m.cfg.Subnet, c.used, c.last)
		if err != nil || got.String() != c.want {
			t.Errorf("AllocateAfter(%v, %v) = %v, %v; want %s", c.used, c.last, got, err, c.want)
		}
	}
}

// TestBridgeMACIsStable: the bridge keeps one MAC while ports come and go
// (a MAC borrowed from a port changes, and sandboxes' gateway entries go
// stale).
func TestBridgeMACIsStable(t *testing.T) {
	m := newTestManager(t, 16)
	mac := func() string {
		l, err := netlink.LinkByName(m.cfg.Bridge)
		if err != nil {
			t.Fatal(err)
		}
		return l.Attrs().HardwareAddr.String()
	}
	want := bridgeMAC(m.cfg.Bridge).String()
	if got := mac(); got != want {
		t.Fatalf("bridge MAC %s, want %s", got, want)
	}
	a := setup(t, m, "mac-a", EgressNone)
	b := setup(t, m, "mac-b", EgressNone)
	if got := mac(); got != want {
		t.Errorf("with ports: bridge MAC %s, want %s", got, want)
	}
	for _, n := range []*Network{a, b} {
		if err := m.Teardown(context.Background(), n.ID); err != nil {
			t.Fatal(err)
		}
		if got := mac(); got != want {
			t.Errorf("after removing %s: bridge MAC %s, want %s", n.ID, got, want)
		}
	}
}
