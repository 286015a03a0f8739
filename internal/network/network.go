// Package network owns per-sandbox networking on the host: one named network
// namespace per sandbox, a veth pair from it to a host bridge, and the
// nftables rules that enforce the sandbox's egress policy.
//
// Policy (nftables tables "forkbox" in the inet and bridge families):
//
//   - The daemon in the host network namespace can always connect TO a
//     sandbox's address (host output is not filtered; replies come back as
//     conntrack "established").
//   - A sandbox can never open a connection to the host itself (any host
//     address, including the bridge's), whatever its egress mode: new
//     connections arriving on the bridge are dropped in the input hook.
//     Egress "all" means the outside world, not the host's local services.
//     The one exception: DNS to the gateway (the daemon's DNS proxy) from
//     sandboxes with names on an allowlist (see nft_egress.go).
//   - Sandboxes cannot reach each other: bridge ports are isolated at L2, and
//     routed traffic back into the bridge is dropped in the forward hook.
//   - Egress "none" (the default): nothing is forwarded from the sandbox.
//     Egress "all": new connections from the sandbox are forwarded and
//     masqueraded out of any interface other than the bridge. Egress
//     "allow": only to its allowlist, minus its denylist; "all" may have a
//     denylist too (Policy, nft_egress.go).
//   - A sandbox cannot spoof another's address: the bridge-family table drops
//     IPv4 and ARP frames whose source address is not the one registered for
//     the port they arrive on, and all IPv6 frames from sandbox ports.
//
// IPv4 forwarding (net.ipv4.ip_forward) is host-wide. It is switched on the
// first time a sandbox with egress "all" or "allow" is set up, and must stay on while
// such sandboxes run. The value it had before is recorded under
// /run/forkbox/ip_forward.d, with one holder file per Manager (per nftables
// table) that needed it; Destroy drops its holder and, when no holder is
// left, puts the recorded value back (see forward.go).
package network

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"

	"github.com/forkbox/forkbox/errdefs"
)

// Egress is a sandbox's outbound network policy.
type Egress string

const (
	// EgressNone lets the sandbox open no connection at all (the default).
	EgressNone Egress = "none"
	// EgressAll lets the sandbox open connections to the outside world
	// (masqueraded), but still not to the host or other sandboxes.
	EgressAll Egress = "all"
)

// Defaults for Config.
const (
	DefaultBridge   = "forkbox0"
	DefaultNetnsDir = "/run/forkbox/netns"
	DefaultTable    = "forkbox"
	DefaultVeth     = "fbx"
)

// DefaultSubnet is the default sandbox subnet; the bridge takes its first address.
var DefaultSubnet = netip.MustParsePrefix("10.88.0.0/16")

// Config configures a Manager. The zero value uses the defaults.
type Config struct {
	Bridge   string       // host bridge name, default "forkbox0"
	Subnet   netip.Prefix // IPv4 subnet, default 10.88.0.0/16; the bridge gets .1
	NetnsDir string       // where named netns files live, default /run/forkbox/netns
	// NetnsDirJoinsParent makes NetnsDir, when it becomes a mount point, a
	// peer of the mount it is on, so that the netns files propagate
	// wherever that mount's own do (a Kubernetes node's Bidirectional run
	// volume carries them to the host). By default it is a peer group of
	// its own: a netns file mounted in it reaches the namespaces copied
	// from ours since, and no other (not a copy of its parent's, such as
	// runsc's view, nor a second, shadowed copy onto the parent itself).
	NetnsDirJoinsParent bool
	// Table names the nftables tables (inet and bridge families), default
	// "forkbox". Each Manager must have its own; tests use it to stay apart
	// from a running daemon.
	Table string
	// VethPrefix starts the name of every host veth, default "fbx", at
	// most 5 bytes. Each Manager must have its own: the anti-spoofing rules
	// cover every port whose name has it.
	VethPrefix string
	Log        *slog.Logger
}

// Network describes one sandbox's network as set up by Setup.
type Network struct {
	ID        string
	NSPath    string     // bind-mounted netns file, for nsenter --net= or setns
	IP        netip.Addr // the sandbox's address (on eth0 inside NSPath)
	Gateway   netip.Addr // the bridge address, the sandbox's default route
	PrefixLen int
	HostVeth  string // host side of the veth pair, a port of the bridge
	Egress    Egress
	Policy    Policy
}

// Manager sets up and tears down sandbox networks. It is safe for
// concurrent use.
type Manager struct {
	cfg     Config
	log     *slog.Logger
	gateway netip.Addr

	nftMu     sync.Mutex // serialises nftables transactions
	forwardMu sync.Mutex
	forwardOn bool

	polMu    sync.RWMutex
	policies map[netip.Addr]Policy // by sandbox address, for the DNS proxy
	applied  map[netip.Addr]Policy // every sandbox's, as set since New
	// mayHaveFlows are the addresses whose conntrack entries a teardown
	// must delete: those found with flows at New, and those given a policy
	// that lets flows start since (until a flush under a flow-free policy).
	mayHaveFlows map[netip.Addr]bool
}

// New returns a Manager, creating or reusing the bridge (up, with the
// gateway address), the nftables tables with their chains and sets, and
// the netns directory. It is idempotent: running it again against existing
// state keeps every sandbox's set elements.
func New(ctx context.Context, cfg Config) (*Manager, error) {
	if cfg.Bridge == "" {
		cfg.Bridge = DefaultBridge
	}
	if !cfg.Subnet.IsValid() {
		cfg.Subnet = DefaultSubnet
	}
	if cfg.NetnsDir == "" {
		cfg.NetnsDir = DefaultNetnsDir
	}
	if cfg.Table == "" {
		cfg.Table = DefaultTable
	}
	if cfg.VethPrefix == "" {
		cfg.VethPrefix = DefaultVeth
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	cfg.Subnet = cfg.Subnet.Masked()
	if !cfg.Subnet.Addr().Is4() || cfg.Subnet.Bits() > 30 || cfg.Subnet.Bits() < 8 {
		return nil, fmt.Errorf("network: subnet %s: want an IPv4 prefix between /8 and /30: %w", cfg.Subnet, errdefs.ErrInvalidArgument)
	}
	if len(cfg.Bridge) > 15 {
		return nil, fmt.Errorf("network: bridge name %q longer than 15 bytes: %w", cfg.Bridge, errdefs.ErrInvalidArgument)
	}
	if len(cfg.VethPrefix) > 5 || len(cfg.Table) > 64 {
		return nil, fmt.Errorf("network: veth prefix %q (max 5 bytes) or table %q (max 64): %w", cfg.VethPrefix, cfg.Table, errdefs.ErrInvalidArgument)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	m := &Manager{cfg: cfg, log: cfg.Log, gateway: cfg.Subnet.Addr().Next(), policies: map[netip.Addr]Policy{}, applied: map[netip.Addr]Policy{},
		mayHaveFlows: map[netip.Addr]bool{}}
	if err := ensureNetnsDir(cfg.NetnsDir, !cfg.NetnsDirJoinsParent); err != nil {
		return nil, err
	}
	if err := m.ensureBridge(); err != nil {
		return nil, err
	}
	if err := m.ensureTables(); err != nil {
		return nil, err
	}
	if err := m.findFlows(); err != nil {
		return nil, err
	}
	m.log.Debug("network ready", slog.String("bridge", cfg.Bridge), slog.String("subnet", cfg.Subnet.String()))
	return m, nil
}

// Gateway returns the bridge address, the sandboxes' default gateway.
func (m *Manager) Gateway() netip.Addr { return m.gateway }

// Bridge is the name of the sandboxes' bridge.
func (m *Manager) Bridge() string { return m.cfg.Bridge }

// Subnet is the sandboxes' subnet.
func (m *Manager) Subnet() netip.Prefix { return m.cfg.Subnet }

// Close releases the Manager. Sandbox networks, the bridge and the rules are
// left in place, for the next daemon to find.
func (m *Manager) Close() error { return nil }

// Destroy removes the bridge, the nftables tables and the netns directory's
// mount, and gives up this Manager's hold on IPv4 forwarding (restoring the
// host's previous value when it was the last holder). Sandbox networks
// should be torn down first. The daemon's uninstall and tests call it.
func (m *Manager) Destroy(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return joinErrs(m.deleteTables(), m.deleteBridge(), m.unblockSubnet(), releaseNetnsDir(m.cfg.NetnsDir), m.releaseForwarding())
}

// unblockSubnet removes every blackhole route into the subnet (those of
// hibernated sandboxes, and any a teardown cut short left).
func (m *Manager) unblockSubnet() error {
	var errs []error
	for _, p := range HostRoutes() {
		if p.Bits() == 32 && m.cfg.Subnet.Contains(p.Addr()) {
			errs = append(errs, unblockAddr(p.Addr()))
		}
	}
	return errors.Join(errs...)
}

// Taken reports whether an address is in use.
type Taken func(netip.Addr) (bool, error)

// AllocateFunc returns a free address of the subnet, after last (the
// address given out last) and wrapping around, skipping the network
// address, the gateway and the broadcast address: an address just freed
// is not handed out again while others are free, so nothing on the host
// (neighbour entries, conntrack, packets in flight) still points at the
// sandbox that had it. taken answers for each candidate (the daemon asks
// its store); it fails with ResourceExhausted when the subnet is full.
func (m *Manager) AllocateFunc(last netip.Addr, taken Taken) (netip.Addr, error) {
	return AllocateFunc(m.cfg.Subnet, last, taken)
}

// AllocateFunc is Manager.AllocateFunc in subnet (its first address is
// the gateway's). Candidates are tried from the one after last, so with
// addresses handed out in order one or two are asked about, whatever the
// number in use; an error of taken ends the search (and is returned, with
// an address the caller must not use).
func AllocateFunc(subnet netip.Prefix, last netip.Addr, taken Taken) (netip.Addr, error) {
	subnet = subnet.Masked()
	first := subnet.Addr().Next().Next() // after the network address and the gateway
	host := func(a netip.Addr) bool {
		return a.IsValid() && subnet.Contains(a) && subnet.Contains(a.Next()) && a.Compare(first) >= 0
	}
	start := first
	if host(last) && host(last.Next()) {
		start = last.Next()
	}
	// From start to the end of the subnet, then from first to start.
	for a := start; host(a); a = a.Next() {
		if t, err := taken(a); err != nil || !t {
			return a, err
		}
	}
	for a := first; host(a) && a.Compare(start) < 0; a = a.Next() {
		if t, err := taken(a); err != nil || !t {
			return a, err
		}
	}
	return netip.Addr{}, fmt.Errorf("network: no free address in %s: %w", subnet, errdefs.ErrResourceExhausted)
}

// checkIP reports whether ip can be a sandbox address in the subnet.
func (m *Manager) checkIP(ip netip.Addr) error {
	if !ip.Is4() || !m.cfg.Subnet.Contains(ip) || ip == m.cfg.Subnet.Addr() || ip == m.gateway || !m.cfg.Subnet.Contains(ip.Next()) {
		return fmt.Errorf("network: address %s is not a host address of %s other than the gateway: %w", ip, m.cfg.Subnet, errdefs.ErrInvalidArgument)
	}
	return nil
}
