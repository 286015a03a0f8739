package network

import (
	"context"
	"fmt"

	"github.com/vishvananda/netlink"

	"github.com/forkbox/forkbox/errdefs"
)

// Counters are a sandbox's network byte counters, from the sandbox's side.
type Counters struct {
	// RxBytes is what the sandbox received, TxBytes what it sent.
	RxBytes, TxBytes uint64
}

// Counters reads sandbox id's byte counters from the host side of its veth
// pair (netlink link statistics): what the host side sends the sandbox
// receives, and the other way round. Under gVisor the sentry's netstack
// sends and receives on the same veth, so the numbers mean the same under
// both runtimes. A sandbox without a veth is NotFound.
func (m *Manager) Counters(ctx context.Context, id string) (Counters, error) {
	if err := validID(id); err != nil {
		return Counters{}, err
	}
	if err := ctx.Err(); err != nil {
		return Counters{}, err
	}
	name := m.hostVethName(id)
	l, err := netlink.LinkByName(name)
	if err != nil {
		if isNotFound(err) {
			return Counters{}, fmt.Errorf("network: sandbox %s has no veth %s: %w", id, name, errdefs.ErrNotFound)
		}
		return Counters{}, fmt.Errorf("network: link %s: %v: %w", name, err, errdefs.ErrInternal)
	}
	st := l.Attrs().Statistics
	if st == nil {
		return Counters{}, fmt.Errorf("network: link %s has no statistics: %w", name, errdefs.ErrUnavailable)
	}
	return Counters{RxBytes: st.TxBytes, TxBytes: st.RxBytes}, nil
}
