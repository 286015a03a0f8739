package network

import (
	"bytes"
	"net/netip"
	"os"
	"testing"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// testNetns creates a netns at path and returns it open; it is closed and
// removed when the test ends.
func testNetns(tb testing.TB, path string) netns.NsHandle {
	tb.Helper()
	if err := createNetns(path); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { removeNetns(path) })
	ns, err := netns.GetFromPath(path)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { ns.Close() })
	return ns
}

// setElements returns the set's elements: addresses for egress_all,
// "ifname/address" for ports.
func (m *Manager) setElements(tb testing.TB, s *nftables.Set) map[string]bool {
	tb.Helper()
	c, err := nftables.New()
	if err != nil {
		tb.Fatal(err)
	}
	els, err := c.GetSetElements(s)
	if err != nil {
		tb.Fatalf("GetSetElements(%s): %v", s.Name, err)
	}
	out := map[string]bool{}
	for _, e := range els {
		k := e.Key
		name := ""
		if len(k) == 20 {
			name = string(bytes.TrimRight(k[:16], "\x00")) + "/"
			k = k[16:]
		}
		out[name+netip.AddrFrom4([4]byte(k)).String()] = true
	}
	return out
}

// assertGone checks that sandbox id has no netns file, mount, veth or set element.
func (m *Manager) assertGone(tb testing.TB, id string) {
	tb.Helper()
	path := m.NSPath(id)
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		tb.Errorf("netns file %s: stat err %v, want not exist", path, err)
	}
	if mounted, _ := isMountPoint(path); mounted {
		tb.Errorf("%s is still mounted", path)
	}
	if _, err := netlink.LinkByName(m.hostVethName(id)); !isNotFound(err) {
		tb.Errorf("veth %s: err %v, want not found", m.hostVethName(id), err)
	}
	if els := m.setElements(tb, m.portsSet()); len(els) != 0 {
		for e := range els {
			if bytes.HasPrefix([]byte(e), []byte(m.hostVethName(id)+"/")) {
				tb.Errorf("ports set still has %s", e)
			}
		}
	}
	if els := m.setElements(tb, m.egressAllSet()); len(els) != 0 {
		ports := m.setElements(tb, m.portsSet())
		if len(ports) == 0 {
			tb.Errorf("egress_all still has %v with no port registered", els)
		}
	}
}

func forwardingOn(tb testing.TB) bool {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_forward")
	if err != nil {
		tb.Fatal(err)
	}
	return len(b) > 0 && b[0] == '1'
}
