// Network test: a sandbox in a netns with a veth address serves TCP to a
// peer netns (both created by the test), with --network=sandbox.

package runsc

import (
	"context"
	"testing"
	"time"

	"github.com/forkbox/forkbox/internal/runtime/spec"
)

func TestNetworkSandbox(t *testing.T) {
	f := newFixture(t, Options{}, spec.SpecOptions{
		Args: []string{"/bin/sh", "-c", "while true; do echo hello | nc -l -p 8080; done"},
	})
	// eth0 (10.231.7.2) in the sandbox netns, peer0 (10.231.7.1) in the
	// peer netns.
	peer := veth(t, f.NetNS, "10.231.7.2/24", "10.231.7.1/24")
	if err := f.rt.Run(context.Background(), f.ID, f.Bundle); err != nil {
		t.Fatalf("run: %v", err)
	}
	got, err := tryDial(peer, "10.231.7.2:8080", 30*time.Second)
	if err != nil {
		t.Fatalf("dial 10.231.7.2:8080: %v", err)
	}
	if got != "hello\n" {
		t.Errorf("read %q from the sandbox, want %q", got, "hello\n")
	}
}
