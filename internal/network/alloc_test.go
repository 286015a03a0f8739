package network

import (
	"net/netip"
	"testing"
)

// allocateAfter is AllocateFunc with the addresses in use given as a list.
func allocateAfter(subnet netip.Prefix, used []netip.Addr, last netip.Addr) (netip.Addr, error) {
	set := make(map[netip.Addr]struct{}, len(used))
	for _, a := range used {
		set[a] = struct{}{}
	}
	return AllocateFunc(subnet, last, func(a netip.Addr) (bool, error) { _, ok := set[a]; return ok, nil })
}

// TestAllocateAfterWraps: addresses go out in order after the last one
// given, wrap to the lowest free one, and never are the network address,
// the gateway or the broadcast address.
func TestAllocateAfterWraps(t *testing.T) {
	subnet := netip.MustParsePrefix("10.231.9.0/29") // hosts .2 to .6
	a := func(i byte) netip.Addr { return netip.AddrFrom4([4]byte{10, 231, 9, i}) }
	for _, c := range []struct {
		name string
		used []netip.Addr
		last netip.Addr
		want netip.Addr
	}{
		{"empty, no last", nil, netip.Addr{}, a(2)},
		{"after last", []netip.Addr{a(2), a(3)}, a(3), a(4)},
		{"skips used after last", []netip.Addr{a(2), a(4), a(5)}, a(3), a(6)},
		{"wraps after the last host", []netip.Addr{a(6)}, a(6), a(2)},
		{"wraps past used", []netip.Addr{a(2), a(3), a(5), a(6)}, a(5), a(4)},
		{"a freed address waits its turn", []netip.Addr{a(2), a(4)}, a(4), a(5)},
		{"last outside the subnet", nil, netip.MustParseAddr("192.0.2.9"), a(2)},
		{"last is the gateway", nil, a(1), a(2)},
	} {
		got, err := allocateAfter(subnet, c.used, c.last)
		if err != nil || got != c.want {
			t.Errorf("%s: got %s, %v, want %s", c.name, got, err, c.want)
		}
	}
	if _, err := allocateAfter(subnet, []netip.Addr{a(2), a(3), a(4), a(5), a(6)}, a(4)); err == nil {
		t.Error("full subnet: got an address, want ResourceExhausted")
	}
}

// BenchmarkAllocateAt1000 is one allocation with 1,000 addresses in use,
// handed out in order (as the daemon does), in the default /16:
//
//	go test ./internal/network -run - -bench AllocateAt1000
func BenchmarkAllocateAt1000(b *testing.B) {
	subnet := DefaultSubnet
	var used []netip.Addr
	var last netip.Addr
	for range 1000 {
		ip, err := allocateAfter(subnet, used, last)
		if err != nil {
			b.Fatal(err)
		}
		used, last = append(used, ip), ip
	}
	b.ResetTimer()
	for b.Loop() {
		if _, err := allocateAfter(subnet, used, last); err != nil {
			b.Fatal(err)
		}
	}
}
