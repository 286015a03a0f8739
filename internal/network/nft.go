package network

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// Names of our nftables objects. Only these are ever touched.
const (
	setEgressAll = "egress_all" // inet: ipv4_addr of sandboxes with egress "all"
	setPorts     = "ports"      // bridge: ifname . ipv4_addr, each port's one address
)

var portsType = nftables.MustConcatSetType(nftables.TypeIFName, nftables.TypeIPAddr)

func (m *Manager) inetTable() *nftables.Table {
	return &nftables.Table{Name: m.cfg.Table, Family: nftables.TableFamilyINet}
}

func (m *Manager) bridgeTable() *nftables.Table {
	return &nftables.Table{Name: m.cfg.Table, Family: nftables.TableFamilyBridge}
}

func (m *Manager) egressAllSet() *nftables.Set {
	return &nftables.Set{Table: m.inetTable(), Name: setEgressAll, KeyType: nftables.TypeIPAddr}
}

func (m *Manager) portsSet() *nftables.Set {
	return &nftables.Set{Table: m.bridgeTable(), Name: setPorts, KeyType: portsType, Concatenation: true}
}

func ifname(n string) []byte {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, n)
	return b
}

func portKey(veth string, ip netip.Addr) []byte {
	a := ip.As4()
	return append(ifname(veth), a[:]...)
}

// Expression helpers. Register 1 is 16 bytes wide; register 2 follows it,
// so "ifname in 1, address in 2" makes the 20-byte concatenated key.
func metaCmp(key expr.MetaKey, op expr.CmpOp, data []byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: key, Register: 1},
		&expr.Cmp{Op: op, Register: 1, Data: data},
	}
}

func ctEstablished() []expr.Any {
	return []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: nativeU32(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED), Xor: nativeU32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: nativeU32(0)},
	}
}

func nativeU32(v uint32) []byte {
	return binaryutil.NativeEndian.PutUint32(v)
}

func rule(t *nftables.Table, c *nftables.Chain, parts ...[]expr.Any) *nftables.Rule {
	var e []expr.Any
	for _, p := range parts {
		e = append(e, p...)
	}
	return &nftables.Rule{Table: t, Chain: c, Exprs: e}
}

var (
	accept = []expr.Any{&expr.Verdict{Kind: expr.VerdictAccept}}
	drop   = []expr.Any{&expr.Verdict{Kind: expr.VerdictDrop}}
)

// ensureTables creates or refreshes our tables. Chains are flushed and
// refilled in the same transaction; sets and their elements are kept.
func (m *Manager) ensureTables() error {
	m.nftMu.Lock()
	defer m.nftMu.Unlock()
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("network: nftables: %v: %w", err, errdefs.ErrUnavailable)
	}
	br := ifname(m.cfg.Bridge)
	ipv4 := []byte{unix.NFPROTO_IPV4}
	accept4 := nftables.ChainPolicyAccept

	inetTable, bridgeTable := m.inetTable(), m.bridgeTable()

	// inet table: input, forward, postrouting nat.
	c.AddTable(inetTable)
	egress := m.egressAllSet()
	if err := c.AddSet(egress, nil); err != nil {
		return fmt.Errorf("network: nft set %s: %v: %w", setEgressAll, err, errdefs.ErrInternal)
	}
	pmap, dnsClients := m.policyMap(), m.dnsClientsSet()
	for _, s := range []*nftables.Set{pmap, dnsClients} {
		if err := c.AddSet(s, nil); err != nil {
			return fmt.Errorf("network: nft set %s: %v: %w", s.Name, err, errdefs.ErrInternal)
		}
	}
	input := c.AddChain(&nftables.Chain{Name: "input", Table: inetTable, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &accept4})
	forward := c.AddChain(&nftables.Chain{Name: "forward", Table: inetTable, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &accept4})
	post := c.AddChain(&nftables.Chain{Name: "postrouting", Table: inetTable, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource, Policy: &accept4})
	for _, ch := range []*nftables.Chain{input, forward, post} {
		c.FlushChain(ch)
	}
	iifBr := metaCmp(expr.MetaKeyIIFNAME, expr.CmpOpEq, br)
	oifBr := metaCmp(expr.MetaKeyOIFNAME, expr.CmpOpEq, br)
	inEgressAll := []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ipv4},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
		&expr.Lookup{SourceRegister: 1, SetName: setEgressAll, SetID: egress.ID},
	}
	// input: from the bridge only replies to the host's own connections.
	c.AddRule(rule(inetTable, input, iifBr, ctEstablished(), accept))
	// ... and DNS to the gateway (the proxy) from sandboxes that use it;
	// the others get a fast "port unreachable" rather than a timeout.
	gw := m.gateway.As4()
	toGateway := append(ipv4Field(16), &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: gw[:]})
	for _, proto := range []byte{unix.IPPROTO_UDP, unix.IPPROTO_TCP} {
		dns := []expr.Any{
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{0, 53}},
		}
		c.AddRule(rule(inetTable, input, iifBr, toGateway, dns, ipv4Field(12), inSet(dnsClients), accept))
		c.AddRule(rule(inetTable, input, iifBr, toGateway, dns,
			[]expr.Any{&expr.Reject{Type: unix.NFT_REJECT_ICMPX_UNREACH, Code: unix.NFT_REJECT_ICMPX_PORT_UNREACH}}))
	}
	c.AddRule(rule(inetTable, input, iifBr, drop))
	// forward: replies both ways; nothing new into the bridge; new out of
	// it only from egress "all" sandboxes, or as a sandbox's lists say.
	c.AddRule(rule(inetTable, forward, iifBr, ctEstablished(), accept))
	c.AddRule(rule(inetTable, forward, oifBr, ctEstablished(), accept))
	c.AddRule(rule(inetTable, forward, oifBr, drop))
	// Egress "all" is the outside world, not link-local services such as a
	// cloud's instance metadata at 169.254.169.254.
	linkLocalDst := []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ipv4},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{169, 254}},
	}
	c.AddRule(rule(inetTable, forward, iifBr, linkLocalDst, drop))
	// Sandboxes with lists: their own chain (nft_egress.go) decides.
	c.AddRule(rule(inetTable, forward, iifBr, ipv4Field(12),
		[]expr.Any{&expr.Lookup{SourceRegister: 1, IsDestRegSet: true, SetName: pmap.Name, SetID: pmap.ID}}))
	c.AddRule(rule(inetTable, forward, iifBr, inEgressAll, accept))
	c.AddRule(rule(inetTable, forward, iifBr, drop))
	// postrouting: masquerade sandboxes leaving by another link (only what
	// the forward chain let through gets there).
	sub := m.cfg.Subnet.Addr().As4()
	mask := net.CIDRMask(m.cfg.Subnet.Bits(), 32)
	fromSubnet := append(ipv4Field(12),
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: []byte{0, 0, 0, 0}},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: sub[:]})
	c.AddRule(rule(inetTable, post, fromSubnet, metaCmp(expr.MetaKeyOIFNAME, expr.CmpOpNeq, br),
		[]expr.Any{&expr.Masq{}}))

	// bridge table: anti-spoofing on sandbox ports.
	c.AddTable(bridgeTable)
	ports := m.portsSet()
	if err := c.AddSet(ports, nil); err != nil {
		return fmt.Errorf("network: nft set %s: %v: %w", setPorts, err, errdefs.ErrInternal)
	}
	pre := c.AddChain(&nftables.Chain{Name: "prerouting", Table: bridgeTable, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityFilter, Policy: &accept4})
	c.FlushChain(pre)
	// Frames from our ports: "iifname fbx*" (meta ibrname would be nicer,
	// but needs CONFIG_NFT_BRIDGE_META, which not every kernel has).
	onBridge := metaCmp(expr.MetaKeyIIFNAME, expr.CmpOpEq, []byte(m.cfg.VethPrefix))
	etherType := func(t uint16) []expr.Any {
		return []expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseLLHeader, Offset: 12, Len: 2},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{byte(t >> 8), byte(t)}},
		}
	}
	notOwnAddr := func(off uint32) []expr.Any {
		return []expr.Any{
			&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
			&expr.Payload{DestRegister: 2, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: 4},
			&expr.Lookup{SourceRegister: 1, SetName: setPorts, SetID: ports.ID, Invert: true},
		}
	}
	c.AddRule(rule(bridgeTable, pre, onBridge, etherType(unix.ETH_P_IP), notOwnAddr(12), drop))  // ip saddr
	c.AddRule(rule(bridgeTable, pre, onBridge, etherType(unix.ETH_P_ARP), notOwnAddr(14), drop)) // arp saddr ip
	c.AddRule(rule(bridgeTable, pre, onBridge, etherType(unix.ETH_P_IPV6), drop))

	if err := c.Flush(); err != nil {
		return fmt.Errorf("network: install nftables rules: %v: %w", err, errdefs.ErrInternal)
	}
	return nil
}

func (m *Manager) deleteTables() error {
	m.nftMu.Lock()
	defer m.nftMu.Unlock()
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("network: nftables: %v: %w", err, errdefs.ErrUnavailable)
	}
	var errs []error
	for _, t := range []*nftables.Table{m.inetTable(), m.bridgeTable()} {
		c.DelTable(t)
		if err := c.Flush(); err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("network: delete table %s: %v: %w", t.Name, err, errdefs.ErrInternal))
		}
	}
	return errors.Join(errs...)
}

// addElements registers a sandbox: its port address and, for egress
// "all", its address in egress_all.
func (m *Manager) addElements(veth string, ip netip.Addr, egress Egress) error {
	m.nftMu.Lock()
	defer m.nftMu.Unlock()
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("network: nftables: %v: %w", err, errdefs.ErrUnavailable)
	}
	if err := c.SetAddElements(m.portsSet(), []nftables.SetElement{{Key: portKey(veth, ip)}}); err != nil {
		return fmt.Errorf("network: nft element: %v: %w", err, errdefs.ErrInternal)
	}
	a := ip.As4()
	if err := c.SetAddElements(m.egressAllSet(), []nftables.SetElement{{Key: a[:]}}); err != nil {
		return fmt.Errorf("network: nft element: %v: %w", err, errdefs.ErrInternal)
	}
	if egress != EgressAll {
		// Added then deleted in one transaction: the address is surely not
		// in egress_all, even if an earlier holder's teardown failed.
		if err := c.SetDeleteElements(m.egressAllSet(), []nftables.SetElement{{Key: a[:]}}); err != nil {
			return fmt.Errorf("network: nft element: %v: %w", err, errdefs.ErrInternal)
		}
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("network: add nft elements for %s: %v: %w", veth, err, errdefs.ErrInternal)
	}
	return nil
}

// delElements removes every element that belongs to the port veth: its
// entries in ports, their addresses in egress_all, and first what each of
// those addresses holds elsewhere: its egress policy's objects, the
// bridge's neighbour entry (pinned by Setup) and the blackhole route
// (while detached). The elements go last, so that a teardown cut short
// (an error, a crash) finds the addresses again when it is retried.
// Missing is fine.
func (m *Manager) delElements(veth string) error {
	return m.delPortElements(veth, func(a netip.Addr, haveInet bool) error {
		m.forgetNeighbour(a)
		err := unblockAddr(a)
		if haveInet {
			err = errors.Join(err, m.dropPolicy(a))
		}
		return err
	})
}

// delPortElements removes the ports and egress_all elements of veth,
// after each of their addresses is given to release (with whether the
// inet table exists); an error from release keeps the elements.
func (m *Manager) delPortElements(veth string, release func(a netip.Addr, haveInet bool) error) error {
	delPorts, delEgress, haveInet, err := m.portElements(veth)
	if err != nil || len(delPorts) == 0 {
		return err
	}
	name := ifname(veth)
	var errs []error
	for _, e := range delPorts {
		if a, ok := netip.AddrFromSlice(e.Key[len(name):]); ok {
			errs = append(errs, release(a, haveInet))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	m.nftMu.Lock()
	defer m.nftMu.Unlock()
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("network: nftables: %v: %w", err, errdefs.ErrUnavailable)
	}
	// Each added, then deleted, in one transaction: surely absent after it,
	// whether release took it out already (dropPolicy takes the address
	// out of egress_all) or not.
	for set, els := range map[*nftables.Set][]nftables.SetElement{m.portsSet(): delPorts, m.egressAllSet(): delEgress} {
		if len(els) == 0 {
			continue
		}
		if err := c.SetAddElements(set, els); err != nil {
			return fmt.Errorf("network: nft element: %v: %w", err, errdefs.ErrInternal)
		}
		if err := c.SetDeleteElements(set, els); err != nil {
			return fmt.Errorf("network: nft delete: %v: %w", err, errdefs.ErrInternal)
		}
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("network: delete nft elements of %s: %v: %w", veth, err, errdefs.ErrInternal)
	}
	return nil
}

// portElements lists the ports and egress_all elements of veth, and
// whether the inet table exists.
func (m *Manager) portElements(veth string) (ports, egressAll []nftables.SetElement, haveInet bool, err error) {
	m.nftMu.Lock()
	defer m.nftMu.Unlock()
	c, err := nftables.New()
	if err != nil {
		return nil, nil, false, fmt.Errorf("network: nftables: %v: %w", err, errdefs.ErrUnavailable)
	}
	if ok, err := m.haveTable(c, nftables.TableFamilyBridge); err != nil || !ok {
		return nil, nil, false, err // no table: nothing registered
	}
	all, err := c.GetSetElements(m.portsSet())
	if err != nil {
		return nil, nil, false, fmt.Errorf("network: list nft set %s: %v: %w", setPorts, err, errdefs.ErrInternal)
	}
	var egress []nftables.SetElement
	if haveInet, err = m.haveTable(c, nftables.TableFamilyINet); err != nil {
		return nil, nil, false, err
	}
	if haveInet {
		if egress, err = c.GetSetElements(m.egressAllSet()); err != nil {
			return nil, nil, false, fmt.Errorf("network: list nft set %s: %v: %w", setEgressAll, err, errdefs.ErrInternal)
		}
	}
	name := ifname(veth)
	for _, e := range all {
		if len(e.Key) != len(name)+4 || !bytes.Equal(e.Key[:len(name)], name) {
			continue
		}
		ports = append(ports, nftables.SetElement{Key: e.Key})
		for _, g := range egress {
			if bytes.Equal(g.Key, e.Key[len(name):]) {
				egressAll = append(egressAll, nftables.SetElement{Key: g.Key})
			}
		}
	}
	return ports, egressAll, haveInet, nil
}

// haveTable reports whether our table of the family exists.
func (m *Manager) haveTable(c *nftables.Conn, family nftables.TableFamily) (bool, error) {
	tables, err := c.ListTablesOfFamily(family)
	if err != nil {
		return false, fmt.Errorf("network: list nft tables: %v: %w", err, errdefs.ErrInternal)
	}
	for _, t := range tables {
		if t.Name == m.cfg.Table {
			return true, nil
		}
	}
	return false, nil
}
