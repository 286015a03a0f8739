package network

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
)

// BenchmarkSetupTeardownBeside sets up 10, then 1,000 sandbox networks
// (netns, veth on the bridge, nftables elements; egress "all" for every
// fourth), and at each count measures setting up and tearing down one more
// beside them: what a create and a close pay on a full host. Root.
//
//	go test ./internal/network -run - -bench SetupTeardownBeside -benchtime 30x
func BenchmarkSetupTeardownBeside(b *testing.B) {
	m := newTestManagerIn(b, 24, netip.MustParsePrefix("10.230.0.0/20"))
	ctx := context.Background()
	var last netip.Addr
	n := 0
	for _, count := range []int{10, 1000} {
		for ; n < count; n++ {
			ip, err := AllocateFunc(m.cfg.Subnet, last, func(netip.Addr) (bool, error) { return false, nil })
			if err != nil {
				b.Fatal(err)
			}
			last = ip
			mode := EgressNone
			if n%4 == 0 {
				mode = EgressAll
			}
			if _, err := m.Setup(ctx, testID(fmt.Sprintf("d%d", n)), ip, Policy{Mode: mode}); err != nil {
				b.Fatal(err)
			}
		}
		ip := netip.MustParseAddr("10.230.15.250")
		for _, mode := range []Egress{EgressNone, EgressAll} {
			b.Run(fmt.Sprintf("live=%d/%s", count, mode), func(b *testing.B) {
				id := testID("one-more")
				for b.Loop() {
					if _, err := m.Setup(ctx, id, ip, Policy{Mode: mode}); err != nil {
						b.Fatal(err)
					}
					if err := m.Teardown(ctx, id); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
