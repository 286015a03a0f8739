package network

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/vishvananda/netlink"
)

// fakeUplink makes a netns standing for "the outside world": a veth from
// the host (10.231.<n>.1/30) to eth0 in the netns (10.231.<n>.2/30). It
// returns the netns path and the outside address.
func fakeUplink(tb testing.TB, n int) (string, netip.Addr) {
	tb.Helper()
	path := filepath.Join(tb.TempDir(), "outside")
	ns := testNetns(tb, path)
	host := fmt.Sprintf("fbu%d", os.Getpid())
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: host}, PeerName: "eth0", PeerNamespace: netlink.NsFd(int(ns))}
	if err := netlink.LinkAdd(veth); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { delVeth(host) })
	hostIP := netip.AddrFrom4([4]byte{10, 231, byte(n), 1})
	outIP := hostIP.Next()
	link, err := netlink.LinkByName(host)
	if err == nil {
		err = netlink.AddrAdd(link, &netlink.Addr{IPNet: ipNet(hostIP, 30)})
	}
	if err == nil {
		err = netlink.LinkSetUp(link)
	}
	if err != nil {
		tb.Fatal(err)
	}
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		tb.Fatal(err)
	}
	defer h.Close()
	eth, err := h.LinkByName("eth0")
	if err == nil {
		err = h.AddrAdd(eth, &netlink.Addr{IPNet: ipNet(outIP, 30)})
	}
	if err == nil {
		err = h.LinkSetUp(eth)
	}
	if err != nil {
		tb.Fatal(err)
	}
	return path, outIP
}

// TestEgress checks egress against a fake outside world: "all" reaches it,
// masqueraded behind the host; "none" does not.
func TestEgress(t *testing.T) {
	m := newTestManager(t, 14)
	outside, outIP := fakeUplink(t, 15)
	l := listenIn(t, outside, net.JoinHostPort(outIP.String(), "8080"))
	seen := make(chan string, 4)
	l.Close() // replace the greeter with one that records the peer
	err := inNetns(outside, func() (err error) { l, err = net.Listen("tcp4", net.JoinHostPort(outIP.String(), "8080")); return err })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			seen <- c.RemoteAddr().(*net.TCPAddr).IP.String()
			c.Write([]byte("ok\n"))
			c.Close()
		}
	}()

	none := setup(t, m, "none", EgressNone)
	all := setup(t, m, "all", EgressAll)
	if err := dial(none.NSPath, l.Addr().String()); err == nil {
		t.Errorf("egress none -> outside: connected, want blocked")
	}
	if err := dial(all.NSPath, l.Addr().String()); err != nil {
		t.Fatalf("egress all -> outside: %v", err)
	}
	if got, want := <-seen, "10.231.15.1"; got != want {
		t.Errorf("outside saw the connection from %s, want %s (masqueraded)", got, want)
	}

	// A link-local service behind the uplink (a cloud's metadata address)
	// is not "the outside world": egress all does not reach it.
	meta := netip.MustParseAddr("169.254.169.254")
	ml := outsideAddr(t, outside, outIP, meta)
	if err := dial("", ml); err != nil {
		t.Fatalf("the metadata listener does not answer the host: %v", err)
	}
	if err := dial(all.NSPath, ml); err == nil {
		t.Errorf("egress all -> link-local %s: connected, want blocked", meta)
	}
}
