package daemon

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/network"
	"github.com/forkbox/forkbox/internal/snapshot"
)

// failingNet is the fake network whose Setup fails after it made the
// sandbox's netns, as a real one that fails half-way leaves it.
type failingNet struct{ fakeNet }

func (n failingNet) Setup(ctx context.Context, id string, ip netip.Addr, pol network.Policy) (*network.Network, error) {
	if _, err := n.fakeNet.Setup(ctx, id, ip, pol); err != nil {
		return nil, err
	}
	return nil, fmt.Errorf("bridge full: %w", errdefs.ErrResourceExhausted)
}

// existingNet is the fake network whose Setup finds the sandbox's netns
// already there.
type existingNet struct{ fakeNet }

func (existingNet) Setup(context.Context, string, netip.Addr, network.Policy) (*network.Network, error) {
	return nil, fmt.Errorf("netns exists: %w", errdefs.ErrAlreadyExists)
}

// failingSnaps is a snapshotter whose Prepare fails.
type failingSnaps struct{ snapshot.Snapshotter }

func (failingSnaps) Prepare(context.Context, string, string, ...snapshot.Opt) error {
	return fmt.Errorf("no space left: %w", errdefs.ErrResourceExhausted)
}

// A create whose rootfs or network fails, while the other is made beside
// it, leaves neither: no netns, no rootfs mount, no writable layer, no
// container, and the error's class is the failed part's (the rootfs's when
// both fail).
func TestPrepareFailureLeavesNothing(t *testing.T) {
	for _, tc := range []struct {
		name   string
		snaps  func(snapshot.Snapshotter) snapshot.Snapshotter
		net    func(*world) netManager
		reason string
	}{
		{"network fails", nil, func(w *world) netManager { return failingNet{fakeNet{w}} }, "bridge full"},
		{"rootfs fails", func(s snapshot.Snapshotter) snapshot.Snapshotter { return failingSnaps{s} }, func(w *world) netManager { return fakeNet{w} }, "no space left"},
		// Both: the rootfs's class (a retry follows it), the network's
		// reason as text.
		{"both fail", func(s snapshot.Snapshotter) snapshot.Snapshotter { return failingSnaps{s} }, func(w *world) netManager { return existingNet{fakeNet{w}} }, "netns exists"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			ctx := context.Background()
			snaps, err := h.openWith(h.runtimes(RuntimeGVisor, RuntimeCrun), tc.snaps, tc.net(h.w))
			if err != nil {
				t.Fatal(err)
			}
			for _, rt := range []string{RuntimeGVisor, RuntimeCrun} {
				_, err := h.d.Create(ctx, CreateOptions{Image: "unit:1", Runtime: rt})
				if !errdefs.IsResourceExhausted(err) || errdefs.IsAlreadyExists(err) || !strings.Contains(err.Error(), tc.reason) {
					t.Fatalf("%s create: %v, want ResourceExhausted with %q", rt, err, tc.reason)
				}
			}
			h.w.mu.Lock()
			defer h.w.mu.Unlock()
			if len(h.w.netns) != 0 || len(h.w.mounts) != 0 || len(h.w.ctr) != 0 {
				t.Errorf("after failed creates: netns %v, mounts %v, containers %d; want none", h.w.netns, h.w.mounts, len(h.w.ctr))
			}
			keys, err := snaps.List(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(keys) != 0 {
				t.Errorf("after failed creates: writable layers %v, want none", keys)
			}
		})
	}
}
