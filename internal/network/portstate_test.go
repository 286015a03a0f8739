package network

import (
	"context"
	"fmt"
	"testing"
)

// TestSetupReturnsForwardingPort: when Setup returns, the sandbox's bridge
// port forwards (by /sys/class/net/PORT/brport/state), so its first packet
// is not dropped by the bridge. Before, 2 of 5 ports read "disabled" or
// "blocking" right after Setup, and a UDP datagram sent then was lost
// (TestTeardownDeletesFlows failed once in CI on it).
func TestSetupReturnsForwardingPort(t *testing.T) {
	m := newTestManager(t, 27)
	ctx := context.Background()
	for i := range 20 {
		nw := setup(t, m, fmt.Sprintf("port%d", i), EgressAll)
		ok, err := portForwarding(nw.HostVeth)
		if err != nil || !ok {
			t.Fatalf("sandbox %d: port %s forwarding %v, %v right after Setup", i, nw.HostVeth, ok, err)
		}
		if err := m.Teardown(ctx, nw.ID); err != nil {
			t.Fatal(err)
		}
	}
}

// TestWaitForwardingGone: waiting on a port that does not exist fails at
// once with an error, not after the bound.
func TestWaitForwardingGone(t *testing.T) {
	if err := waitForwarding(context.Background(), "fbx-no-such"); err == nil {
		t.Fatal("a missing port: got nil, want an error")
	}
}
