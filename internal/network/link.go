package network

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

const (
	aliasPrefix = "forkbox:" // IFLA_IFALIAS of a host veth: "forkbox:<id>"
	peerName    = "eth0"
)

// hostVethName derives the host side veth name from the sandbox id: the
// veth prefix ("fbx") and hex digits of the id's SHA-256, 15 bytes, the
// kernel's limit.
func (m *Manager) hostVethName(id string) string {
	sum := sha256.Sum256([]byte(id))
	return m.cfg.VethPrefix + hex.EncodeToString(sum[:])[:15-len(m.cfg.VethPrefix)]
}

func isNotFound(err error) bool {
	var lnf netlink.LinkNotFoundError
	return errors.As(err, &lnf) || errors.Is(err, unix.ENODEV) || errors.Is(err, unix.ENOENT)
}

// ensureBridge creates or reuses the bridge, gives it the gateway address
// and brings it up.
func (m *Manager) ensureBridge() error {
	name := m.cfg.Bridge
	link, err := netlink.LinkByName(name)
	if isNotFound(err) {
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: name}}
		if err := netlink.LinkAdd(br); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("network: create bridge %s: %v: %w", name, err, errdefs.ErrInternal)
		}
		link, err = netlink.LinkByName(name)
	}
	if err != nil {
		return fmt.Errorf("network: bridge %s: %v: %w", name, err, errdefs.ErrInternal)
	}
	if link.Type() != "bridge" {
		return fmt.Errorf("network: link %s exists and is a %s, not a bridge: %w", name, link.Type(), errdefs.ErrFailedPrecondition)
	}
	want := &netlink.Addr{IPNet: ipNet(m.gateway, m.cfg.Subnet.Bits())}
	addrs, err := dump(func() ([]netlink.Addr, error) { return netlink.AddrList(link, netlink.FAMILY_V4) })
	if err != nil {
		return fmt.Errorf("network: list addresses of %s: %v: %w", name, err, errdefs.ErrInternal)
	}
	have := false
	for _, a := range addrs {
		if a.IPNet.String() == want.IPNet.String() {
			have = true
		}
	}
	if !have {
		if err := netlink.AddrAdd(link, want); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("network: add %s to %s: %v: %w", want.IPNet, name, err, errdefs.ErrInternal)
		}
	}
	// A bridge without a MAC of its own takes the lowest of its ports', so
	// its MAC changes as sandboxes come and go, and the sandboxes' cached
	// entry for the gateway goes stale: their replies to the host are lost
	// until it expires (seen as ~25 s stalls under churn). A fixed, locally
	// administered MAC derived from the name keeps it stable.
	if mac := bridgeMAC(name); !bytes.Equal(link.Attrs().HardwareAddr, mac) {
		if err := netlink.LinkSetHardwareAddr(link, mac); err != nil {
			return fmt.Errorf("network: set the MAC of %s: %v: %w", name, err, errdefs.ErrInternal)
		}
	}
	if err := netlink.LinkSetUp(link); err != nil {
		return fmt.Errorf("network: bring up %s: %v: %w", name, err, errdefs.ErrInternal)
	}
	return nil
}

// bridgeMAC is a stable, locally administered unicast MAC for a bridge.
func bridgeMAC(name string) net.HardwareAddr {
	sum := sha256.Sum256([]byte("forkbox-bridge:" + name))
	mac := net.HardwareAddr(sum[:6])
	mac[0] = (mac[0] | 0x02) &^ 0x01
	return mac
}

func (m *Manager) deleteBridge() error {
	link, err := netlink.LinkByName(m.cfg.Bridge)
	if isNotFound(err) {
		return nil
	}
	if err == nil {
		err = netlink.LinkDel(link)
	}
	if err != nil && !isNotFound(err) {
		return fmt.Errorf("network: delete bridge %s: %v: %w", m.cfg.Bridge, err, errdefs.ErrInternal)
	}
	return nil
}

// MaxBridgePorts is how many ports a Linux bridge takes (port numbers are
// 10 bits, 0 unused; more fail with EXFULL): the most running sandboxes
// one daemon's network holds. A hibernated sandbox gives its port back
// (Detach) and takes one when it wakes (Attach).
const MaxBridgePorts = 1023

// addVeth creates the veth pair with its peer directly inside the netns as
// eth0, and attaches the host side to the bridge as an isolated port.
// The host side is left down; upVeth brings it up.
func (m *Manager) addVeth(id, host string, ns netns.NsHandle) error {
	br, err := netlink.LinkByName(m.cfg.Bridge)
	if err != nil {
		return fmt.Errorf("network: bridge %s: %v: %w", m.cfg.Bridge, err, errdefs.ErrUnavailable)
	}
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: host, MasterIndex: br.Attrs().Index},
		PeerName:      peerName,
		PeerNamespace: netlink.NsFd(int(ns)),
	}
	if err := netlink.LinkAdd(veth); err != nil {
		if errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("network: veth %s: %w", host, errdefs.ErrAlreadyExists)
		}
		// netlink creates the pair, then attaches it to the bridge in a
		// second request: a failure there leaves the pair, which only the
		// netns's asynchronous destruction would remove later.
		derr := delVeth(host)
		if errors.Is(err, unix.EXFULL) {
			return errors.Join(m.bridgeFull(), derr)
		}
		return errors.Join(fmt.Errorf("network: create veth %s: %v: %w", host, err, errdefs.ErrInternal), derr)
	}
	link, err := netlink.LinkByName(host)
	if err != nil {
		return fmt.Errorf("network: veth %s: %v: %w", host, err, errdefs.ErrInternal)
	}
	if err := netlink.LinkSetAlias(link, aliasPrefix+id); err != nil {
		return fmt.Errorf("network: set alias of %s: %v: %w", host, err, errdefs.ErrInternal)
	}
	if err := netlink.LinkSetIsolated(link, true); err != nil {
		return fmt.Errorf("network: isolate bridge port %s: %v: %w", host, err, errdefs.ErrInternal)
	}
	return nil
}

// bridgeFull is the error of a port the bridge has no room for.
func (m *Manager) bridgeFull() error {
	return fmt.Errorf("network: bridge %s is full: a Linux bridge has at most %d ports, one per running sandbox (hibernated ones hold none; more need another daemon with its own --bridge and --subnet): %w",
		m.cfg.Bridge, MaxBridgePorts, errdefs.ErrResourceExhausted)
}

// joinBridge makes link, a sandbox's veth that Attach finds (one still
// attached, or one a daemon before Detach deleted pairs took off the
// bridge and kept), an isolated port of the bridge again. A full bridge
// is ResourceExhausted.
func (m *Manager) joinBridge(link netlink.Link) error {
	br, err := netlink.LinkByName(m.cfg.Bridge)
	if err != nil {
		return fmt.Errorf("network: bridge %s: %v: %w", m.cfg.Bridge, err, errdefs.ErrUnavailable)
	}
	if link.Attrs().MasterIndex != br.Attrs().Index {
		if err := netlink.LinkSetMasterByIndex(link, br.Attrs().Index); err != nil {
			if errors.Is(err, unix.EXFULL) {
				return m.bridgeFull()
			}
			return fmt.Errorf("network: attach %s to bridge %s: %v: %w", link.Attrs().Name, m.cfg.Bridge, err, errdefs.ErrInternal)
		}
	}
	if err := netlink.LinkSetIsolated(link, true); err != nil {
		return fmt.Errorf("network: isolate bridge port %s: %v: %w", link.Attrs().Name, err, errdefs.ErrInternal)
	}
	return nil
}

// blockAddr routes ip, a detached sandbox's address, nowhere: traffic to
// it is dropped on the host (the host's own connects fail at once) instead
// of resolving it on the bridge, where each ARP request reaches every
// port. A blackhole, not unreachable: no ICMP answer tells a sandbox that
// probes the subnet which addresses are hibernated. Idempotent.
func blockAddr(ip netip.Addr) error {
	if err := netlink.RouteReplace(blockRoute(ip)); err != nil {
		return fmt.Errorf("network: blackhole route to %s: %v: %w", ip, err, errdefs.ErrInternal)
	}
	return nil
}

// unblockAddr removes blockAddr's route, if any.
func unblockAddr(ip netip.Addr) error {
	if err := netlink.RouteDel(blockRoute(ip)); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("network: remove the blackhole route to %s: %v: %w", ip, err, errdefs.ErrInternal)
	}
	return nil
}

func blockRoute(ip netip.Addr) *netlink.Route {
	return &netlink.Route{Dst: ipNet(ip, 32), Type: unix.RTN_BLACKHOLE, Table: unix.RT_TABLE_MAIN}
}

// HostRoutes are the destinations of the host's IPv4 routes (other
// daemons' and tests' subnets among them): where a new subnet must not
// overlap. Nil when they cannot be listed.
func HostRoutes() []netip.Prefix {
	rs, err := netlink.RouteList(nil, netlink.FAMILY_V4)
	if err != nil {
		return nil
	}
	var out []netip.Prefix
	for _, r := range rs {
		if r.Dst == nil {
			continue
		}
		ones, _ := r.Dst.Mask.Size()
		if a, ok := netip.AddrFromSlice(r.Dst.IP.To4()); ok {
			out = append(out, netip.PrefixFrom(a, ones).Masked())
		}
	}
	return out
}

func upVeth(host string) error {
	link, err := netlink.LinkByName(host)
	if err == nil {
		err = netlink.LinkSetUp(link)
	}
	if err != nil {
		return fmt.Errorf("network: bring up %s: %v: %w", host, err, errdefs.ErrInternal)
	}
	return nil
}

// delVeth deletes the host side of a veth pair (which deletes the peer).
// Missing is fine.
func delVeth(host string) error {
	link, err := netlink.LinkByName(host)
	if isNotFound(err) {
		return nil
	}
	if err == nil {
		err = netlink.LinkDel(link)
	}
	if err != nil && !isNotFound(err) {
		return fmt.Errorf("network: delete veth %s: %v: %w", host, err, errdefs.ErrInternal)
	}
	return nil
}

// configureInside sets up lo and eth0 in the netns: address, up, default
// route. It returns eth0's MAC.
func configureInside(ns netns.NsHandle, ip, gw netip.Addr, bits int) (net.HardwareAddr, error) {
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return nil, fmt.Errorf("network: netlink handle in netns: %v: %w", err, errdefs.ErrInternal)
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err == nil {
		err = h.LinkSetUp(lo)
	}
	if err != nil {
		return nil, fmt.Errorf("network: bring up lo: %v: %w", err, errdefs.ErrInternal)
	}
	eth, err := h.LinkByName(peerName)
	if err != nil {
		return nil, fmt.Errorf("network: %s in netns: %v: %w", peerName, err, errdefs.ErrInternal)
	}
	if err := h.AddrReplace(eth, &netlink.Addr{IPNet: ipNet(ip, bits)}); err != nil {
		return nil, fmt.Errorf("network: add %s/%d to %s: %v: %w", ip, bits, peerName, err, errdefs.ErrInternal)
	}
	if err := h.LinkSetUp(eth); err != nil {
		return nil, fmt.Errorf("network: bring up %s: %v: %w", peerName, err, errdefs.ErrInternal)
	}
	route := &netlink.Route{LinkIndex: eth.Attrs().Index, Gw: net.IP(gw.AsSlice()), Scope: netlink.SCOPE_UNIVERSE}
	if err := h.RouteReplace(route); err != nil {
		return nil, fmt.Errorf("network: default route via %s: %v: %w", gw, err, errdefs.ErrInternal)
	}
	return eth.Attrs().HardwareAddr, nil
}

// ourVeths returns the host veths of ours, by name, with the sandbox id
// from their alias ("" when the alias is missing).
func (m *Manager) ourVeths() (map[string]string, error) {
	links, err := dump(netlink.LinkList)
	if err != nil {
		return nil, fmt.Errorf("network: list links: %v: %w", err, errdefs.ErrInternal)
	}
	out := map[string]string{}
	for _, l := range links {
		a := l.Attrs()
		if l.Type() != "veth" || !strings.HasPrefix(a.Name, m.cfg.VethPrefix) {
			continue
		}
		out[a.Name] = strings.TrimPrefix(a.Alias, aliasPrefix)
		if !strings.HasPrefix(a.Alias, aliasPrefix) {
			out[a.Name] = ""
		}
	}
	return out, nil
}

func ipNet(ip netip.Addr, bits int) *net.IPNet {
	return &net.IPNet{IP: net.IP(ip.AsSlice()), Mask: net.CIDRMask(bits, ip.BitLen())}
}

// pinNeighbour records where sandbox ip is at L2 for good: a permanent
// neighbour entry on the bridge (ip → the MAC of the netns's eth0, which
// gVisor also keeps, fresh or restored) and a static forwarding entry of
// that MAC on the sandbox's port. Without them every sandbox costs every
// other one: the kernel keeps dynamic neighbour entries only up to
// gc_thresh2 (512 by default) before evicting them, so past a few hundred
// sandboxes the host re-resolved addresses all the time, and each ARP
// request, broadcast on the bridge, woke every sandbox's Sentry (1,000 idle
// gVisor sandboxes took a whole core; 400 took 2%); and a port's learned
// entry ages out when its sandbox is quiet, so the next frame to it is
// flooded to every port. Permanent entries are never collected and do not
// count against the thresholds. It replaces whatever entry ip had (a
// closed sandbox's address taken again).
func (m *Manager) pinNeighbour(host string, ip netip.Addr, mac net.HardwareAddr) error {
	br, err := netlink.LinkByName(m.cfg.Bridge)
	if err != nil {
		return fmt.Errorf("network: bridge %s: %v: %w", m.cfg.Bridge, err, errdefs.ErrUnavailable)
	}
	port, err := netlink.LinkByName(host)
	if err != nil {
		return fmt.Errorf("network: veth %s: %v: %w", host, err, errdefs.ErrInternal)
	}
	if err := netlink.NeighSet(&netlink.Neigh{LinkIndex: port.Attrs().Index, Family: unix.AF_BRIDGE,
		Flags: netlink.NTF_MASTER, State: netlink.NUD_NOARP, HardwareAddr: mac}); err != nil {
		return fmt.Errorf("network: forwarding entry of %s on %s: %v: %w", mac, host, err, errdefs.ErrInternal)
	}
	if err := netlink.NeighSet(&netlink.Neigh{LinkIndex: br.Attrs().Index, Family: netlink.FAMILY_V4,
		State: netlink.NUD_PERMANENT, IP: ip.AsSlice(), HardwareAddr: mac}); err != nil {
		return fmt.Errorf("network: neighbour entry %s → %s: %v: %w", ip, mac, err, errdefs.ErrInternal)
	}
	return nil
}

// forgetNeighbour deletes the bridge's neighbour (ARP) entry for ip, if any.
func (m *Manager) forgetNeighbour(ip netip.Addr) {
	br, err := netlink.LinkByName(m.cfg.Bridge)
	if err != nil {
		return
	}
	_ = netlink.NeighDel(&netlink.Neigh{LinkIndex: br.Attrs().Index, Family: netlink.FAMILY_V4, IP: ip.AsSlice()})
}
