package network

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"time"

	"github.com/forkbox/forkbox/errdefs"
)

// checkPolicy checks a Policy built by hand the way ParsePolicy checks
// lists (the daemon parses; tests and callers may not).
func checkPolicy(pol Policy) error {
	allow, deny := pol.Lists()
	got, err := ParsePolicy(string(pol.Mode), allow, deny)
	if err != nil {
		return fmt.Errorf("network: %w", err)
	}
	if got.Mode != pol.Mode {
		return fmt.Errorf("network: egress %q: %w", pol.Mode, errdefs.ErrInvalidArgument)
	}
	return nil
}

// SetPolicy changes the egress policy of the running sandbox id at ip:
// its lists in nftables are replaced in one transaction, the addresses
// resolved under the old policy are dropped, and so are the conntrack
// entries of its open connections that the new policy would not let
// start (conntrack.go). The daemon also calls it on restart, to give the
// DNS proxy the policies of the sandboxes it finds: the flows found at New
// that such a first policy would not let start are deleted then, with
// those to public addresses kept when it has names (this Manager has not
// seen what they resolved to).
func (m *Manager) SetPolicy(ctx context.Context, id string, ip netip.Addr, pol Policy) error {
	if err := validID(id); err != nil {
		return err
	}
	if err := m.checkIP(ip); err != nil {
		return err
	}
	if err := checkPolicy(pol); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if pol.Mode != EgressNone {
		if err := m.enableForwarding(); err != nil {
			return err
		}
	}
	// polMu across the change: the proxy never adds an address resolved
	// under the old policy to the new one's set.
	m.polMu.Lock()
	defer m.polMu.Unlock()
	old, known := m.applied[ip]
	found := m.mayHaveFlows[ip] // flows of an earlier Manager's, at New
	if !pol.flowFree() {
		m.mayHaveFlows[ip] = true // before the rules let any start
	}
	if err := m.applyPolicy(ip, pol, true); err != nil {
		return err
	}
	m.setPolicyLocked(ip, pol)
	// A policy seen before is compared with the old one. A first one
	// (after a restart) cannot be: the flows found at New may have been
	// let through by a policy recorded since (the daemon records a change
	// before it applies it, and may have crashed between), so those it
	// would not let start go too.
	if (known && !samePolicy(old, pol)) || (!known && found) {
		if err := m.flushFlows(ip, &pol, !known); err != nil {
			return err
		}
		if pol.flowFree() {
			delete(m.mayHaveFlows, ip) // every flow went, none can start
		}
	}
	m.log.Debug("egress policy set", slog.String("sandbox", id), slog.String("egress", string(pol.Mode)))
	return nil
}

func (m *Manager) setPolicyLocked(ip netip.Addr, pol Policy) {
	m.applied[ip] = pol
	if pol.HasNames() {
		m.policies[ip] = pol
	} else {
		delete(m.policies, ip)
	}
}

// dropPolicy removes the egress objects of the sandbox at ip and the
// conntrack entries of its flows (the address is reused). Deleting them
// reads the host's whole conntrack table (the kernel has no delete by
// source address), so it is done only for an address that may have flows
// (see flowFree): not for the common sandbox with egress "none".
func (m *Manager) dropPolicy(ip netip.Addr) error {
	m.polMu.Lock()
	defer m.polMu.Unlock()
	delete(m.policies, ip)
	delete(m.applied, ip)
	err := m.applyPolicy(ip, Policy{Mode: EgressNone}, true)
	if !m.mayHaveFlows[ip] {
		return err
	}
	ferr := m.flushFlows(ip, nil, false)
	if ferr == nil {
		delete(m.mayHaveFlows, ip)
	}
	return errors.Join(err, ferr)
}

// Names returns the allowed and denied names of the sandbox at src, and
// false when it does not resolve through the proxy. The DNS proxy asks.
func (m *Manager) Names(src netip.Addr) (allow, deny []string, ok bool) {
	m.polMu.RLock()
	defer m.polMu.RUnlock()
	p, ok := m.policies[src.Unmap()]
	return p.AllowNames, p.DenyNames, ok
}

// AddResolved lets the sandbox at src reach those of addrs, resolved for
// name, that it may, for timeout, and returns them: IPv4 addresses that
// are public (PublicAddr) or covered by a CIDR on its allow list. Others
// (a private answer: DNS rebinding) are left out; the proxy leaves them out
// of its answer too. It fails with FailedPrecondition when the sandbox's
// policy (which may have changed since the query came in) does not allow
// name, ResourceExhausted when its set is full.
func (m *Manager) AddResolved(ctx context.Context, src netip.Addr, name string, addrs []netip.Addr, timeout time.Duration) ([]netip.Addr, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	src = src.Unmap()
	m.polMu.RLock()
	defer m.polMu.RUnlock()
	p, ok := m.policies[src]
	if !ok || !MatchName(p.AllowNames, name) || MatchName(p.DenyNames, name) {
		return nil, fmt.Errorf("network: %s may not resolve %q: %w", src, name, errdefs.ErrFailedPrecondition)
	}
	var kept []netip.Addr
	for _, a := range addrs {
		a = a.Unmap()
		if !a.Is4() {
			continue
		}
		if PublicAddr(a) || slices.ContainsFunc(p.Allow, func(c netip.Prefix) bool { return c.Contains(a) }) {
			kept = append(kept, a)
		}
	}
	if len(kept) == 0 {
		return nil, nil
	}
	if err := m.addResolved(src, kept, timeout); err != nil {
		return nil, err
	}
	return kept, nil
}
