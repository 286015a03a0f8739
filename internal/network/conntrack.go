package network

import (
	"fmt"
	"log/slog"
	"net/netip"
	"slices"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/vishvananda/netlink"
)

// Connections already open outlive an nftables change: their conntrack
// entries match "ct state established" before any list is looked at. So
// when a sandbox's policy changes, the entries of its flows that the new
// policy would not let start are deleted (the next packet of such a flow
// is new again, and dropped); when its network goes, all of them are.

// flowFree reports whether a sandbox under pol can have no flow of its
// own in conntrack: with egress "none" and no lists, everything it starts
// is dropped (forward and input chains) before its entry is confirmed.
func (p Policy) flowFree() bool {
	return p.Mode == EgressNone && len(p.Allow)+len(p.AllowNames)+len(p.Deny)+len(p.DenyNames) == 0
}

// findFlows marks the subnet's addresses that have flows in conntrack now
// (New calls it once): flows of sandboxes set up before this Manager, whose
// policies it has not seen, are deleted when their networks go.
func (m *Manager) findFlows() error {
	flows, err := dump(func() ([]*netlink.ConntrackFlow, error) {
		return netlink.ConntrackTableList(netlink.ConntrackTable, netlink.FAMILY_V4)
	})
	if err != nil {
		return fmt.Errorf("network: list conntrack entries: %v: %w", err, errdefs.ErrInternal)
	}
	for _, f := range flows {
		if src, ok := netip.AddrFromSlice(f.Forward.SrcIP.To4()); ok && m.cfg.Subnet.Contains(src) {
			m.mayHaveFlows[src] = true
		}
	}
	return nil
}

// staleFlows matches the conntrack entries of flows started by the
// sandbox at ip (original source) that pol does not permit. With pol nil,
// all of them. With unseen, pol is the first policy this Manager applies
// to ip, and a flow to a public address is kept when pol has names: it may
// go to an address resolved for one of them before the restart.
type staleFlows struct {
	ip      netip.Addr
	gateway netip.Addr
	pol     *Policy
	unseen  bool
}

func (f staleFlows) MatchConntrackFlow(flow *netlink.ConntrackFlow) bool {
	src, ok := netip.AddrFromSlice(flow.Forward.SrcIP.To4())
	if !ok || src != f.ip {
		return false
	}
	if f.pol == nil {
		return true
	}
	dst, ok := netip.AddrFromSlice(flow.Forward.DstIP.To4())
	if !ok {
		return true
	}
	if f.unseen && f.pol.HasNames() && PublicAddr(dst) && !f.pol.denies(dst) {
		return false
	}
	return !f.pol.permits(dst, f.gateway)
}

// denies reports whether dst is on p's deny list of CIDRs.
func (p Policy) denies(dst netip.Addr) bool {
	return slices.ContainsFunc(p.Deny, func(c netip.Prefix) bool { return c.Contains(dst) })
}

// permits reports whether a new connection to dst would pass pol by its
// mode and CIDRs. Addresses resolved for names do not count: a policy
// change empties them.
func (p Policy) permits(dst, gateway netip.Addr) bool {
	in := func(l []netip.Prefix) bool {
		return slices.ContainsFunc(l, func(c netip.Prefix) bool { return c.Contains(dst) })
	}
	switch {
	case dst == gateway:
		return p.HasNames() // DNS to the proxy
	case linkLocal4.Contains(dst), p.denies(dst):
		return false
	case p.Mode == EgressAll:
		return true
	case p.Mode == EgressAllow:
		return in(p.Allow)
	}
	return false
}

// flushFlows deletes the conntrack entries of the sandbox at ip's flows
// that pol does not permit (all of them when pol is nil); unseen is
// staleFlows's.
func (m *Manager) flushFlows(ip netip.Addr, pol *Policy, unseen bool) error {
	// A deletion is safe to repeat: an interrupted one is asked again.
	n, err := dump(func() (uint, error) {
		return netlink.ConntrackDeleteFilters(netlink.ConntrackTable, netlink.FAMILY_V4, staleFlows{ip: ip, gateway: m.gateway, pol: pol, unseen: unseen})
	})
	if err != nil {
		return fmt.Errorf("network: delete the conntrack entries of %s: %v: %w", ip, err, errdefs.ErrInternal)
	}
	if n > 0 {
		m.log.Debug("conntrack entries deleted", slog.String("addr", ip.String()), slog.Uint64("flows", uint64(n)))
	}
	return nil
}

// samePolicy reports whether a and b are the same policy.
func samePolicy(a, b Policy) bool {
	aa, ad := a.Lists()
	ba, bd := b.Lists()
	return a.Mode == b.Mode && slices.Equal(aa, ba) && slices.Equal(ad, bd)
}
