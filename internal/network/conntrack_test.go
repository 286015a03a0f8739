package network

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
)

// echoIn serves TCP and UDP echo on addr inside the netns at path.
func echoIn(t *testing.T, path, addr string) {
	t.Helper()
	var l net.Listener
	var pc net.PacketConn
	err := inNetns(path, func() (err error) {
		if l, err = net.Listen("tcp4", addr); err != nil {
			return err
		}
		pc, err = net.ListenPacket("udp4", addr)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close(); pc.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); io.Copy(c, c) }()
		}
	}()
	go func() {
		buf := make([]byte, 64)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			pc.WriteTo(buf[:n], from)
		}
	}()
}

// echoes reports whether c echoes a line back within the deadline.
func echoes(c net.Conn, r *bufio.Reader, within time.Duration) error {
	c.SetDeadline(time.Now().Add(within))
	if _, err := c.Write([]byte("ping\n")); err != nil {
		return err
	}
	if udp, ok := c.(*net.UDPConn); ok {
		buf := make([]byte, 64)
		_, err := udp.Read(buf)
		return err
	}
	_, err := r.ReadString('\n')
	return err
}

// TestPolicyChangeCutsFlows: connections a sandbox opened while its policy
// allowed them stop passing data once a change forbids them (their
// conntrack entries are deleted), and those it still allows go on.
func TestPolicyChangeCutsFlows(t *testing.T) {
	m := newTestManager(t, 20)
	outside, outIP := fakeUplink(t, 21)
	target := net.JoinHostPort(outIP.String(), "7")
	echoIn(t, outside, target)
	ctx := context.Background()
	pol, err := ParsePolicy("", []string{outIP.String()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	sb := setupPolicy(t, m, "flows", pol)

	var tcp, udp net.Conn
	err = inNetns(sb.NSPath, func() (err error) {
		if tcp, err = net.DialTimeout("tcp4", target, 5*time.Second); err != nil {
			return err
		}
		udp, err = net.Dial("udp4", target)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer tcp.Close()
	defer udp.Close()
	r := bufio.NewReader(tcp)
	for name, c := range map[string]net.Conn{"tcp": tcp, "udp": udp} {
		if err := echoes(c, r, 5*time.Second); err != nil {
			t.Fatalf("%s before any change: %v", name, err)
		}
	}

	// A change that still allows them: they go on.
	wider, err := ParsePolicy("", []string{outIP.String(), "192.0.2.0/24"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.SetPolicy(ctx, sb.ID, sb.IP, wider); err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]net.Conn{"tcp": tcp, "udp": udp} {
		if err := echoes(c, r, 5*time.Second); err != nil {
			t.Errorf("%s after a change that still allows it: %v", name, err)
		}
	}

	// Egress none: no more data either way.
	if err := m.SetPolicy(ctx, sb.ID, sb.IP, Policy{Mode: EgressNone}); err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]net.Conn{"tcp": tcp, "udp": udp} {
		if err := echoes(c, r, 3*time.Second); err == nil {
			t.Errorf("%s after SetPolicy none: still echoed", name)
		}
	}
}

// flowsFrom counts the conntrack entries of flows started at ip.
func flowsFrom(t *testing.T, ip netip.Addr) int {
	t.Helper()
	flows, err := netlink.ConntrackTableList(netlink.ConntrackTable, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, f := range flows {
		if src, ok := netip.AddrFromSlice(f.Forward.SrcIP.To4()); ok && src == ip {
			n++
		}
	}
	return n
}

// TestTeardownDeletesFlows: the conntrack entries of a sandbox that could
// open connections go with its network, also when a new Manager (a
// restarted daemon) tears it down; a sandbox with egress "none" is known
// to have none, and its teardown reads no conntrack table.
func TestTeardownDeletesFlows(t *testing.T) {
	m := newTestManager(t, 22)
	outside, outIP := fakeUplink(t, 23)
	target := net.JoinHostPort(outIP.String(), "7")
	echoIn(t, outside, target)
	ctx := context.Background()
	talk := func(nw *Network) {
		t.Helper()
		err := inNetns(nw.NSPath, func() error {
			c, err := net.Dial("udp4", target)
			if err != nil {
				return err
			}
			defer c.Close()
			return echoes(c, bufio.NewReader(c), 5*time.Second)
		})
		if err != nil {
			t.Fatalf("a flow from %s: %v", nw.IP, err)
		}
		if flowsFrom(t, nw.IP) == 0 {
			t.Fatalf("no conntrack entry from %s after a flow", nw.IP)
		}
	}

	a := setup(t, m, "ct-a", EgressAll)
	talk(a)
	if err := m.Teardown(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	if n := flowsFrom(t, a.IP); n != 0 {
		t.Errorf("after teardown: got %d entries from %s, want 0", n, a.IP)
	}

	// Set up by one Manager, torn down by the next (a restart).
	b := setup(t, m, "ct-b", EgressAll)
	talk(b)
	m2, err := New(ctx, m.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !m2.mayHaveFlows[b.IP] {
		t.Errorf("a new Manager did not find the flows of %s", b.IP)
	}
	if err := m2.Teardown(ctx, b.ID); err != nil {
		t.Fatal(err)
	}
	if n := flowsFrom(t, b.IP); n != 0 {
		t.Errorf("after teardown by a new Manager: got %d entries from %s, want 0", n, b.IP)
	}

	// Egress "none", then "all" and back: flow-free again only after the
	// change to "none" deleted its flows.
	c := setup(t, m, "ct-c", EgressNone)
	if m.mayHaveFlows[c.IP] {
		t.Errorf("egress none: %s marked as having flows", c.IP)
	}
	if err := m.SetPolicy(ctx, c.ID, c.IP, Policy{Mode: EgressAll}); err != nil {
		t.Fatal(err)
	}
	talk(c)
	if !m.mayHaveFlows[c.IP] {
		t.Errorf("egress all: %s not marked as having flows", c.IP)
	}
	if err := m.SetPolicy(ctx, c.ID, c.IP, Policy{Mode: EgressNone}); err != nil {
		t.Fatal(err)
	}
	if m.mayHaveFlows[c.IP] || flowsFrom(t, c.IP) != 0 {
		t.Errorf("back to none: marked %v, %d entries; want neither", m.mayHaveFlows[c.IP], flowsFrom(t, c.IP))
	}
	if err := m.Teardown(ctx, c.ID); err != nil {
		t.Fatal(err)
	}
}

// TestFirstPolicyAfterRestartCutsFlows: a restarted daemon's first policy
// for a sandbox (reconcile applies the recorded one, which a crash may have
// kept from reaching the kernel) cuts the flows found at New that it would
// not let start, and keeps those it allows.
func TestFirstPolicyAfterRestartCutsFlows(t *testing.T) {
	m := newTestManager(t, 24)
	outside, outIP := fakeUplink(t, 25)
	target := net.JoinHostPort(outIP.String(), "7")
	echoIn(t, outside, target)
	ctx := context.Background()
	sb := setup(t, m, "ct-first", EgressAll)
	var c net.Conn
	err := inNetns(sb.NSPath, func() (err error) {
		c, err = net.DialTimeout("tcp4", target, 5*time.Second)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	if err := echoes(c, r, 5*time.Second); err != nil {
		t.Fatalf("before the restart: %v", err)
	}

	// The same policy again from a new Manager: the flow goes on.
	m2, err := New(ctx, m.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := m2.SetPolicy(ctx, sb.ID, sb.IP, Policy{Mode: EgressAll}); err != nil {
		t.Fatal(err)
	}
	if err := echoes(c, r, 5*time.Second); err != nil {
		t.Fatalf("after a restart with the same policy: %v", err)
	}

	// A policy recorded but never applied before the crash: "none" is the
	// first this Manager applies, and the flow stops.
	m3, err := New(ctx, m.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := m3.SetPolicy(ctx, sb.ID, sb.IP, Policy{Mode: EgressNone}); err != nil {
		t.Fatal(err)
	}
	if n := flowsFrom(t, sb.IP); n != 0 {
		t.Errorf("first policy none after a restart: %d conntrack entries from %s left, want 0", n, sb.IP)
	}
	if err := echoes(c, r, 3*time.Second); err == nil {
		t.Error("first policy none after a restart: the connection still echoed")
	}
}

// TestStaleFlowsUnseenNames: a first policy with names keeps flows to
// public addresses (they may go to an address resolved before the
// restart) unless its deny list covers them, and cuts flows to private
// ones its CIDRs do not allow; a policy seen before keeps neither.
func TestStaleFlowsUnseenNames(t *testing.T) {
	pol, err := ParsePolicy("", []string{"example.com", "10.9.0.0/16"}, []string{"198.51.100.0/24"})
	if err != nil {
		t.Fatal(err)
	}
	src := netip.MustParseAddr("10.88.0.5")
	flow := func(dst string) *netlink.ConntrackFlow {
		f := &netlink.ConntrackFlow{}
		f.Forward.SrcIP = src.AsSlice()
		f.Forward.DstIP = netip.MustParseAddr(dst).AsSlice()
		return f
	}
	for _, tc := range []struct {
		dst          string
		unseen, kill bool
	}{
		{"93.184.216.34", true, false}, // public: may be example.com's
		{"93.184.216.34", false, true}, // seen: resolved addresses went with the change
		{"198.51.100.7", true, true},   // denied
		{"10.9.1.1", true, false},      // on the allow list
		{"10.7.1.1", true, true},       // private, not allowed
		{"169.254.169.254", true, true},
	} {
		f := staleFlows{ip: src, gateway: netip.MustParseAddr("10.88.0.1"), pol: &pol, unseen: tc.unseen}
		if got := f.MatchConntrackFlow(flow(tc.dst)); got != tc.kill {
			t.Errorf("flow to %s (unseen %v): deleted %v, want %v", tc.dst, tc.unseen, got, tc.kill)
		}
	}
}
