package network

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// Egress lists in nftables, built to scale to thousands of sandboxes:
//
//   - one verdict map, egress_policy, keyed by sandbox address, sends a
//     new connection from a sandbox with lists to that sandbox's own chain
//     eg-<addr> (one hash lookup, whatever the number of sandboxes);
//   - the chain has at most four rules: daddr in its deny set → drop; in its
//     allow set → accept; in its resolved set → accept; for egress "all"
//     with a deny list, accept. The allow and deny sets (ea-, ed-) are
//     interval sets (a lookup is logarithmic in the list); the resolved set
//     (er-) holds the addresses the DNS proxy answered, each with a timeout
//     from its TTL, and has a fixed size the kernel enforces;
//   - a sandbox without lists has none of these, and costs nothing.
//
// The link-local drop and the "nothing into the bridge" rules come before
// the map in the forward chain, and new connections to the host are dropped
// in the input chain, except DNS to the gateway from sandboxes in
// dns_clients (those with names on their allow list).
const (
	mapEgressPolicy = "egress_policy" // inet: ipv4_addr : verdict (jump eg-<addr>)
	setDNSClients   = "dns_clients"   // inet: ipv4_addr of sandboxes using the DNS proxy
	// MaxResolved bounds the resolved addresses a sandbox holds at once
	// (the kernel refuses more: the proxy then answers SERVFAIL).
	MaxResolved = 1024
)

func (m *Manager) policyMap() *nftables.Set {
	return &nftables.Set{Table: m.inetTable(), Name: mapEgressPolicy, IsMap: true, KeyType: nftables.TypeIPAddr, DataType: nftables.TypeVerdict}
}

func (m *Manager) dnsClientsSet() *nftables.Set {
	return &nftables.Set{Table: m.inetTable(), Name: setDNSClients, KeyType: nftables.TypeIPAddr}
}

func addrKey(ip netip.Addr) string { a := ip.As4(); return hex.EncodeToString(a[:]) }

func (m *Manager) sandboxChain(ip netip.Addr) *nftables.Chain {
	return &nftables.Chain{Name: "eg-" + addrKey(ip), Table: m.inetTable()}
}

func (m *Manager) allowSet(ip netip.Addr) *nftables.Set {
	return &nftables.Set{Table: m.inetTable(), Name: "ea-" + addrKey(ip), KeyType: nftables.TypeIPAddr, Interval: true}
}

func (m *Manager) denySet(ip netip.Addr) *nftables.Set {
	return &nftables.Set{Table: m.inetTable(), Name: "ed-" + addrKey(ip), KeyType: nftables.TypeIPAddr, Interval: true}
}

func (m *Manager) resolvedSet(ip netip.Addr) *nftables.Set {
	return &nftables.Set{Table: m.inetTable(), Name: "er-" + addrKey(ip), KeyType: nftables.TypeIPAddr, HasTimeout: true, Size: MaxResolved}
}

// ipv4Field loads an IPv4 header address (offset 12 = saddr, 16 = daddr)
// into register 1, for IPv4 packets only.
func ipv4Field(off uint32) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: 4},
	}
}

func inSet(s *nftables.Set) []expr.Any {
	return []expr.Any{&expr.Lookup{SourceRegister: 1, SetName: s.Name, SetID: s.ID}}
}

// intervalElements turns prefixes into interval set elements, merging
// overlapping and adjacent ranges (the kernel refuses overlaps).
func intervalElements(ps []netip.Prefix) []nftables.SetElement {
	type rng struct{ lo, hi netip.Addr }
	var rs []rng
	for _, p := range ps {
		if !p.Addr().Is4() {
			continue // IPv6 never leaves a sandbox: nothing to deny
		}
		p = p.Masked()
		a := p.Addr().As4()
		n := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])
		n |= uint32((uint64(1) << (32 - p.Bits())) - 1)
		rs = append(rs, rng{p.Addr(), netip.AddrFrom4([4]byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)})})
	}
	slices.SortFunc(rs, func(a, b rng) int { return a.lo.Compare(b.lo) })
	var merged []rng
	for _, r := range rs {
		if l := len(merged); l > 0 {
			last := &merged[l-1]
			if next := last.hi.Next(); !next.IsValid() || r.lo.Compare(next) <= 0 {
				if r.hi.Compare(last.hi) > 0 {
					last.hi = r.hi
				}
				continue
			}
		}
		merged = append(merged, r)
	}
	var out []nftables.SetElement
	for _, r := range merged {
		out = append(out, nftables.SetElement{Key: r.lo.AsSlice()})
		if end := r.hi.Next(); end.IsValid() {
			out = append(out, nftables.SetElement{Key: end.AsSlice(), IntervalEnd: true})
		}
	}
	return out
}

// applyPolicy makes the nftables state of the sandbox at ip match pol, in
// one transaction: its chain and sets (made, refilled or removed), its
// egress_policy, egress_all and dns_clients elements. flushResolved empties
// the addresses resolved so far (a changed policy must not keep them).
func (m *Manager) applyPolicy(ip netip.Addr, pol Policy, flushResolved bool) error {
	m.nftMu.Lock()
	defer m.nftMu.Unlock()
	return m.applyPolicyLocked(ip, pol, flushResolved)
}

func (m *Manager) applyPolicyLocked(ip netip.Addr, pol Policy, flushResolved bool) error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("network: nftables: %v: %w", err, errdefs.ErrUnavailable)
	}
	t := m.inetTable()
	key := ip.AsSlice()
	chain, allow, deny, resolved := m.sandboxChain(ip), m.allowSet(ip), m.denySet(ip), m.resolvedSet(ip)
	if !pol.chained() {
		// The common case (none, or all without lists): when the sandbox
		// has no objects of its own (they are made and removed together),
		// only egress_all may need a change. A transaction that deletes
		// costs the kernel an RCU grace period (~15 ms); this does not.
		if _, err := c.GetSetByName(t, allow.Name); errors.Is(err, unix.ENOENT) {
			return m.setEgressAll(c, key, pol.Mode == EgressAll)
		}
	}
	// Made whatever the policy, so that the deletes below always find them.
	c.AddChain(chain)
	for _, s := range []*nftables.Set{allow, deny, resolved} {
		if err := c.AddSet(s, nil); err != nil {
			return fmt.Errorf("network: nft set %s: %v: %w", s.Name, err, errdefs.ErrInternal)
		}
	}
	c.FlushChain(chain)
	pmap := m.policyMap()
	jump := nftables.SetElement{Key: key, VerdictData: &expr.Verdict{Kind: expr.VerdictJump, Chain: chain.Name}}
	if err := c.SetAddElements(pmap, []nftables.SetElement{jump}); err != nil {
		return fmt.Errorf("network: nft element: %v: %w", err, errdefs.ErrInternal)
	}
	toggle := func(s *nftables.Set, on bool) error {
		e := []nftables.SetElement{{Key: key}}
		if err := c.SetAddElements(s, e); err != nil {
			return fmt.Errorf("network: nft element: %v: %w", err, errdefs.ErrInternal)
		}
		if !on { // added then deleted: surely absent
			if err := c.SetDeleteElements(s, e); err != nil {
				return fmt.Errorf("network: nft element: %v: %w", err, errdefs.ErrInternal)
			}
		}
		return nil
	}
	if err := toggle(m.egressAllSet(), pol.Mode == EgressAll); err != nil {
		return err
	}
	if err := toggle(m.dnsClientsSet(), pol.HasNames()); err != nil {
		return err
	}
	if !pol.chained() {
		if err := c.SetDeleteElements(pmap, []nftables.SetElement{{Key: key}}); err != nil {
			return fmt.Errorf("network: nft element: %v: %w", err, errdefs.ErrInternal)
		}
		c.DelChain(chain)
		for _, s := range []*nftables.Set{allow, deny, resolved} {
			c.DelSet(s)
		}
	} else {
		c.FlushSet(allow)
		c.FlushSet(deny)
		if flushResolved {
			c.FlushSet(resolved)
		}
		if e := intervalElements(pol.Allow); len(e) > 0 {
			if err := c.SetAddElements(allow, e); err != nil {
				return fmt.Errorf("network: nft element: %v: %w", err, errdefs.ErrInternal)
			}
		}
		if e := intervalElements(pol.Deny); len(e) > 0 {
			if err := c.SetAddElements(deny, e); err != nil {
				return fmt.Errorf("network: nft element: %v: %w", err, errdefs.ErrInternal)
			}
		}
		daddr := ipv4Field(16)
		c.AddRule(rule(t, chain, daddr, inSet(deny), drop))
		c.AddRule(rule(t, chain, daddr, inSet(allow), accept))
		c.AddRule(rule(t, chain, daddr, inSet(resolved), accept))
		if pol.Mode == EgressAll {
			c.AddRule(rule(t, chain, accept))
		}
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("network: egress policy of %s: %v: %w", ip, err, errdefs.ErrInternal)
	}
	return nil
}

// addResolved lets the sandbox at ip reach addrs for timeout. An address
// already there gets the new timeout. When the sandbox's set is full the
// kernel refuses, and so does this (ResourceExhausted).
func (m *Manager) addResolved(ip netip.Addr, addrs []netip.Addr, timeout time.Duration) error {
	var e []nftables.SetElement
	for _, a := range addrs {
		if a.Is4() {
			e = append(e, nftables.SetElement{Key: a.AsSlice(), Timeout: timeout})
		}
	}
	if len(e) == 0 {
		return nil
	}
	m.nftMu.Lock()
	defer m.nftMu.Unlock()
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("network: nftables: %v: %w", err, errdefs.ErrUnavailable)
	}
	s := m.resolvedSet(ip)
	// An element there already takes the new timeout (Linux 6.10 and
	// later; before, it keeps its own, and the sandbox's next lookup after
	// it expires adds it again).
	if err := c.SetAddElements(s, e); err != nil {
		return fmt.Errorf("network: nft element: %v: %w", err, errdefs.ErrInternal)
	}
	if err := c.Flush(); err != nil {
		if isSetFull(err) {
			return fmt.Errorf("network: resolved addresses of %s: more than %d: %w", ip, MaxResolved, errdefs.ErrResourceExhausted)
		}
		return fmt.Errorf("network: resolved addresses of %s: %v: %w", ip, err, errdefs.ErrInternal)
	}
	return nil
}

func isSetFull(err error) bool {
	return errors.Is(err, unix.ENFILE) || errors.Is(err, unix.ENOSPC)
}

// setEgressAll puts key in egress_all or takes it out, deleting only when
// it is there.
func (m *Manager) setEgressAll(c *nftables.Conn, key []byte, on bool) error {
	s := m.egressAllSet()
	e := []nftables.SetElement{{Key: key}}
	if on {
		if err := c.SetAddElements(s, e); err != nil {
			return fmt.Errorf("network: nft element: %v: %w", err, errdefs.ErrInternal)
		}
	} else {
		els, err := c.GetSetElements(s)
		if err != nil {
			return fmt.Errorf("network: list nft set %s: %v: %w", s.Name, err, errdefs.ErrInternal)
		}
		if !slices.ContainsFunc(els, func(x nftables.SetElement) bool { return bytes.Equal(x.Key, key) }) {
			return nil
		}
		if err := c.SetDeleteElements(s, e); err != nil {
			return fmt.Errorf("network: nft element: %v: %w", err, errdefs.ErrInternal)
		}
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("network: egress_all element: %v: %w", err, errdefs.ErrInternal)
	}
	return nil
}
