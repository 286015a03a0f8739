package network

import (
	"fmt"
	"net/netip"
	"testing"
	"time"
)

// BenchmarkPolicyAt1000 applies egress policies (8 allowed CIDRs, 2 denied,
// a name) for 1,000 sandbox addresses, then measures changing one of them
// and adding resolved addresses to one, with the other 999 in place:
//
//	go test ./internal/network -run - -bench PolicyAt1000 -benchtime 200x
var benchN = 1000

func BenchmarkPolicyAt1000(b *testing.B) {
	m := newTestManager(b, 19)
	var allow, deny []string
	for i := range 8 {
		allow = append(allow, fmt.Sprintf("10.%d.0.0/16", 100+i))
	}
	deny = []string{"10.100.1.0/24", "10.101.7.7"}
	pol, err := ParsePolicy("", append(allow, "api.example.com"), deny)
	if err != nil {
		b.Fatal(err)
	}
	addr := func(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 240, byte(i >> 8), byte(i)}) }
	start := time.Now()
	for i := range benchN {
		if err := m.applyPolicy(addr(i), pol, true); err != nil {
			b.Fatal(err)
		}
		m.polMu.Lock()
		m.setPolicyLocked(addr(i), pol)
		m.polMu.Unlock()
	}
	b.Logf("1,000 policies applied in %v", time.Since(start).Round(time.Millisecond))
	b.Cleanup(func() {
		for i := range benchN {
			m.dropPolicy(addr(i))
		}
	})
	resolved := []netip.Addr{netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2")}
	b.Run("change-one", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			if err := m.applyPolicy(addr(i%benchN), pol, true); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("no-lists", func(b *testing.B) { // what every other sandbox's setup pays
		for i := 0; i < b.N; i++ {
			if err := m.applyPolicy(netip.AddrFrom4([4]byte{10, 241, byte(i >> 8), byte(i)}), Policy{Mode: EgressNone}, true); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("add-resolved", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			if err := m.addResolved(addr(i%benchN), resolved, time.Minute); err != nil {
				b.Fatal(err)
			}
		}
	})
}
