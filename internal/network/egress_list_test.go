package network

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
)

// outsideAddr gives the fake outside world (fakeUplink) one more address,
// routed from the host through outIP, with a listener on port 80.
func outsideAddr(t *testing.T, outside string, outIP, a netip.Addr) string {
	t.Helper()
	h := nsHandle(t, outside)
	eth, err := h.LinkByName("eth0")
	if err == nil {
		err = h.AddrAdd(eth, &netlink.Addr{IPNet: ipNet(a, 32)})
	}
	if err != nil {
		t.Fatal(err)
	}
	route := &netlink.Route{Dst: ipNet(a, 32), Gw: net.IP(outIP.AsSlice())}
	if err := netlink.RouteAdd(route); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { netlink.RouteDel(route) })
	l := listenIn(t, outside, net.JoinHostPort(a.String(), "80"))
	return l.Addr().String()
}

// TestEgressLists checks CIDR allow and deny lists and resolved addresses
// against a fake outside world, and changing them on a live sandbox.
func TestEgressLists(t *testing.T) {
	m := newTestManager(t, 16)
	outside, outIP := fakeUplink(t, 17)
	a1 := outsideAddr(t, outside, outIP, netip.MustParseAddr("10.251.1.1"))   // allowed CIDR
	a2 := outsideAddr(t, outside, outIP, netip.MustParseAddr("10.251.1.9"))   // allowed CIDR, denied /32
	a3 := outsideAddr(t, outside, outIP, netip.MustParseAddr("203.0.113.1"))  // resolved only (TEST-NET-3: public)
	priv := outsideAddr(t, outside, outIP, netip.MustParseAddr("10.251.2.1")) // a private answer
	meta := outsideAddr(t, outside, outIP, netip.MustParseAddr("169.254.169.254"))
	ctx := context.Background()

	pol, err := ParsePolicy("", []string{"10.251.1.0/24", "allowed.test"}, []string{"10.251.1.9"})
	if err != nil {
		t.Fatal(err)
	}
	sb := setupPolicy(t, m, "lists", pol)
	all := setupPolicy(t, m, "alldeny", Policy{Mode: EgressAll, Deny: []netip.Prefix{netip.MustParsePrefix("10.251.1.0/24")}})
	victim := setup(t, m, "victim", EgressNone)
	vl := listenIn(t, victim.NSPath, net.JoinHostPort(victim.IP.String(), "9000"))

	check := func(nw *Network, addr string, want bool) {
		t.Helper()
		err := dial(nw.NSPath, addr)
		// A dial that must connect is tried again (a loaded host can take
		// longer than dial's 1.5 s), up to a bound against a hang.
		for deadline := time.Now().Add(30 * time.Second); want && err != nil && time.Now().Before(deadline); {
			err = dial(nw.NSPath, addr)
		}
		if want && err != nil {
			t.Errorf("%s -> %s: %v, want connected", nw.ID, addr, err)
		}
		if !want && err == nil {
			t.Errorf("%s -> %s: connected, want blocked", nw.ID, addr)
		}
	}
	check(sb, a1, true)
	check(sb, a2, false) // deny wins
	check(sb, a3, false) // not resolved yet
	check(sb, meta, false)
	check(sb, vl.Addr().String(), false)
	check(all, a1, false)
	check(all, a3, true)
	check(all, meta, false)

	// The proxy resolved allowed.test to a3: it passes (for an hour: the
	// test does not race its timeout; that it ends is checked below).
	if _, err := m.AddResolved(ctx, sb.IP, "allowed.test", []netip.Addr{netip.MustParseAddr("203.0.113.1")}, time.Hour); err != nil {
		t.Fatal(err)
	}
	check(sb, a3, true)
	// An allowed name answering private addresses (DNS rebinding): not
	// allowed, unless a CIDR of the list covers them (10.251.1.0/24).
	kept, err := m.AddResolved(ctx, sb.IP, "allowed.test", []netip.Addr{netip.MustParseAddr("10.251.2.1"),
		netip.MustParseAddr("10.251.1.7"), netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("100.64.0.1"), netip.MustParseAddr("203.0.113.5")}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(kept) != "[10.251.1.7 203.0.113.5]" {
		t.Errorf("AddResolved kept %v, want [10.251.1.7 203.0.113.5]", kept)
	}
	check(sb, priv, false)
	if el := m.setElements(t, m.resolvedSet(sb.IP)); el["10.251.2.1"] || el["127.0.0.1"] || el["100.64.0.1"] {
		t.Errorf("private answers in the resolved set: %v", el)
	}
	// Resolved again with a longer TTL: the element takes the new timeout
	// (the first, a minute, cannot run out in between).
	if _, err := m.AddResolved(ctx, sb.IP, "allowed.test", []netip.Addr{netip.MustParseAddr("203.0.113.9")}, time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := m.AddResolved(ctx, sb.IP, "allowed.test", []netip.Addr{netip.MustParseAddr("203.0.113.9")}, time.Hour); err != nil {
		t.Fatal(err)
	}
	if got := resolvedExpiry(t, m, sb.IP, netip.MustParseAddr("203.0.113.9")); got < 50*time.Minute {
		t.Errorf("re-resolved with a 1h TTL: expires in %v, want about 1h", got)
	}
	// Resolved again with a short TTL: a3, which passed, stops passing
	// once it runs out (polled, with a bound against a hang).
	if _, err := m.AddResolved(ctx, sb.IP, "allowed.test", []netip.Addr{netip.MustParseAddr("203.0.113.1")}, time.Second); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for dial(sb.NSPath, a3) == nil {
		if time.Now().After(deadline) {
			t.Fatalf("the resolved address still passes 30s after its 1s timeout")
		}
	}
	// A name not on the list, or a sandbox without names, adds nothing.
	if _, err := m.AddResolved(ctx, sb.IP, "other.test", []netip.Addr{netip.MustParseAddr("203.0.113.1")}, time.Minute); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("AddResolved for a name not on the list: %v, want FailedPrecondition", err)
	}
	if _, err := m.AddResolved(ctx, all.IP, "allowed.test", []netip.Addr{netip.MustParseAddr("203.0.113.1")}, time.Minute); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("AddResolved for a sandbox without names: %v, want FailedPrecondition", err)
	}
	// The set is bounded.
	many := make([]netip.Addr, MaxResolved+1)
	for i := range many {
		many[i] = netip.AddrFrom4([4]byte{11, 252, byte(i >> 8), byte(i)})
	}
	if _, err := m.AddResolved(ctx, sb.IP, "allowed.test", many, time.Minute); !errdefs.IsResourceExhausted(err) {
		t.Errorf("AddResolved of %d addresses: %v, want ResourceExhausted", len(many), err)
	}

	// Live change: the lists are replaced, resolved addresses dropped.
	if _, err := m.AddResolved(ctx, sb.IP, "allowed.test", []netip.Addr{netip.MustParseAddr("203.0.113.1")}, time.Minute); err != nil {
		t.Fatal(err)
	}
	pol2, err := ParsePolicy("", []string{"10.251.1.9", "allowed.test"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.SetPolicy(ctx, sb.ID, sb.IP, pol2); err != nil {
		t.Fatal(err)
	}
	check(sb, a1, false)
	check(sb, a2, true)
	check(sb, a3, false)
	if err := m.SetPolicy(ctx, sb.ID, sb.IP, Policy{Mode: EgressAll}); err != nil {
		t.Fatal(err)
	}
	check(sb, a1, true)
	check(sb, meta, false)
	if err := m.SetPolicy(ctx, sb.ID, sb.IP, Policy{Mode: EgressNone}); err != nil {
		t.Fatal(err)
	}
	check(sb, a1, false)
	if _, _, ok := m.Names(sb.IP); ok {
		t.Errorf("egress none: the sandbox still has names for the proxy")
	}

	// Teardown leaves no chain or set of the sandbox.
	if err := m.SetPolicy(ctx, sb.ID, sb.IP, pol); err != nil {
		t.Fatal(err)
	}
	if err := m.Teardown(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	assertNoPolicyObjects(t, m, sb.IP)
}

func setupPolicy(tb testing.TB, m *Manager, name string, pol Policy) *Network {
	tb.Helper()
	nw := setupWith(tb, m, name, pol)
	tb.Cleanup(func() { m.Teardown(context.Background(), nw.ID) })
	return nw
}

// assertNoPolicyObjects checks that nothing of the egress policy of the
// sandbox at ip is left: no chain, set or map element.
func assertNoPolicyObjects(t *testing.T, m *Manager, ip netip.Addr) {
	t.Helper()
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		t.Fatal(err)
	}
	for _, ch := range chains {
		if ch.Table.Name == m.cfg.Table && ch.Name == m.sandboxChain(ip).Name {
			t.Errorf("chain %s is left", ch.Name)
		}
	}
	sets, err := c.GetSets(m.inetTable())
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range sets {
		for _, own := range []*nftables.Set{m.allowSet(ip), m.denySet(ip), m.resolvedSet(ip)} {
			if s.Name == own.Name {
				t.Errorf("set %s is left", s.Name)
			}
		}
	}
	els, err := c.GetSetElements(m.policyMap())
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range els {
		if netip.AddrFrom4([4]byte(e.Key)) == ip {
			t.Errorf("egress_policy still maps %s", ip)
		}
	}
	if m.setElements(t, m.dnsClientsSet())[ip.String()] {
		t.Errorf("dns_clients still has %s", ip)
	}
}

// resolvedExpiry returns how long a resolved address of the sandbox at ip
// has left.
func resolvedExpiry(t *testing.T, m *Manager, ip, a netip.Addr) time.Duration {
	t.Helper()
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	els, err := c.GetSetElements(m.resolvedSet(ip))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range els {
		if netip.AddrFrom4([4]byte(e.Key)) == a {
			return e.Expires
		}
	}
	t.Fatalf("%s is not in the resolved set of %s", a, ip)
	return 0
}
