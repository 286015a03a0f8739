package e2e

import (
	"net/netip"
	"testing"
)

// A run's subnets skip every third octet whose subnets the host routes
// already (another run's bridge): by the pid alone, two runs shared one
// once in 150 and reached each other's sandboxes.
func TestFreeThird(t *testing.T) {
	p := netip.MustParsePrefix
	if got := freeThird(17, nil); got != 117 {
		t.Errorf("no routes: got %d, want 117", got)
	}
	// Another run's bridge at 117, a fake outside at 118, and a wider
	// route, 10.250.0.0/17, over every third octet up to 127.
	routes := []netip.Prefix{p("10.213.117.0/24"), p("10.249.118.0/24"), p("10.250.0.0/17"), p("192.168.0.0/16")}
	if got := freeThird(17, routes); got != 128 {
		t.Errorf("117 to 127 taken: got %d, want 128", got)
	}
	// Past 249 it wraps to 100.
	if got := freeThird(149, []netip.Prefix{p("10.213.249.0/24")}); got != 100 {
		t.Errorf("249 taken: got %d, want 100", got)
	}
}
