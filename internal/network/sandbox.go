package network

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sort"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// stepHook, when set (by tests), runs after each named Setup step; an error
// makes Setup fail there and unwind.
var stepHook func(step string) error

func step(name string) error {
	if stepHook != nil {
		return stepHook(name)
	}
	return nil
}

// NSPath returns where the netns file of sandbox id lives.
func (m *Manager) NSPath(id string) string { return filepath.Join(m.cfg.NetnsDir, id) }

func validID(id string) error {
	if id == "" || len(id) > 200 || id == "." || id == ".." {
		return fmt.Errorf("network: sandbox id %q: %w", id, errdefs.ErrInvalidArgument)
	}
	for _, r := range id {
		ok := r == '-' || r == '_' || r == '.' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z'
		if !ok {
			return fmt.Errorf("network: sandbox id %q has character %q: %w", id, r, errdefs.ErrInvalidArgument)
		}
	}
	return nil
}

// Setup creates the network of sandbox id: a named netns at NSPath(id) with
// eth0 at ip (default route via the gateway) and lo up, a veth pair to the
// bridge on an isolated port, the nftables elements for egress, and ip
// pinned to eth0's MAC on the bridge (pinNeighbour). On
// failure every step done is undone. It fails with AlreadyExists if the
// sandbox already has a netns or a veth.
func (m *Manager) Setup(ctx context.Context, id string, ip netip.Addr, pol Policy) (nw *Network, err error) {
	if err := validID(id); err != nil {
		return nil, err
	}
	if err := m.checkIP(ip); err != nil {
		return nil, err
	}
	if pol.Mode == "" && len(pol.Allow)+len(pol.AllowNames)+len(pol.Deny)+len(pol.DenyNames) == 0 {
		pol.Mode = EgressNone
	}
	if err := checkPolicy(pol); err != nil {
		return nil, err
	}
	egress := pol.Mode
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	path := m.NSPath(id)
	host := m.hostVethName(id)
	log := m.log.With(slog.String("sandbox", id))

	var undo cleanup
	defer func() {
		if err != nil {
			if uerr := undo.run(); uerr != nil {
				log.Error("unwinding network setup", slog.Any("error", uerr))
				err = errors.Join(err, uerr)
			}
		}
	}()

	if egress != EgressNone {
		if err := m.enableForwarding(); err != nil {
			return nil, err
		}
	}
	if err := createNetns(path); err != nil {
		return nil, err
	}
	undo.add(func() error { return removeNetns(path) })
	if err := step("netns"); err != nil {
		return nil, err
	}

	ns, err := netns.GetFromPath(path)
	if err != nil {
		return nil, fmt.Errorf("network: open netns %s: %v: %w", path, err, errdefs.ErrInternal)
	}
	defer ns.Close()

	mac, err := m.plugIn(id, host, ns, ip, &undo)
	if err != nil {
		return nil, err
	}
	if err := m.addElements(host, ip, egress); err != nil {
		return nil, err
	}
	undo.add(func() error { return m.delElements(host) })
	undo.add(func() error { return m.dropPolicy(ip) }) // a half-applied policy too
	if err := m.SetPolicy(ctx, id, ip, pol); err != nil {
		return nil, err
	}
	if err := step("nft"); err != nil {
		return nil, err
	}
	if err := m.bringUp(ctx, host, ip, mac); err != nil {
		return nil, err
	}
	if err := step("up"); err != nil {
		return nil, err
	}
	undo.release()
	log.Debug("sandbox network set up", slog.String("ip", ip.String()), slog.String("egress", string(egress)))
	return &Network{
		ID: id, NSPath: path, IP: ip, Gateway: m.gateway, PrefixLen: m.cfg.Subnet.Bits(),
		HostVeth: host, Egress: egress, Policy: pol,
	}, nil
}

// plugIn makes sandbox id's bridge port into the open netns ns: the veth
// pair, eth0 inside at ip, with its undo step on undo. It returns eth0's
// MAC.
func (m *Manager) plugIn(id, host string, ns netns.NsHandle, ip netip.Addr, undo *cleanup) (net.HardwareAddr, error) {
	if err := m.addVeth(id, host, ns); err != nil {
		return nil, err
	}
	undo.add(func() error { return delVeth(host) })
	if err := step("veth"); err != nil {
		return nil, err
	}
	mac, err := configureInside(ns, ip, m.gateway, m.cfg.Subnet.Bits())
	if err != nil {
		return nil, err
	}
	return mac, step("inside")
}

// bringUp pins ip to mac on the bridge and brings the port up, returning
// once it forwards.
func (m *Manager) bringUp(ctx context.Context, host string, ip netip.Addr, mac net.HardwareAddr) error {
	// The address may have belonged to a sandbox closed a moment ago: the
	// pin replaces the neighbour entry that still holds that sandbox's MAC,
	// and the route that kept traffic off it while it was detached goes.
	if err := m.pinNeighbour(host, ip, mac); err != nil {
		return err
	}
	if err := unblockAddr(ip); err != nil {
		return err
	}
	if err := upVeth(host); err != nil {
		return err
	}
	return waitForwarding(ctx, host)
}

// Detach gives back what sandbox id holds on the host while it holds no
// process (it is hibernated), all but its address: its bridge port (a
// Linux bridge has MaxBridgePorts, and 10,000 hibernated sessions must
// not hold one each), its veth pair, and its netns's bind mount. Every
// mount on the host is copied into each new mount namespace, and gVisor
// makes two at every start, restore and wake: with 10,000 hibernated
// sessions holding a mount each, each of them took 100-300 ms longer.
// The netns file stays, empty, holding the sandbox's place (List finds
// it; Setup of the same id is AlreadyExists), and so do the port's
// nftables elements and the egress policy, so that Teardown still finds
// and releases the address. The address's pin goes and a blackhole route
// takes its place, so that traffic to it ends on the host rather than in
// ARP requests to every port (and a sandbox probing the subnet learns
// nothing: silence, as from a running one). Attach makes the netns and
// the pair again. Idempotent.
func (m *Manager) Detach(ctx context.Context, id string, ip netip.Addr) error {
	if err := validID(id); err != nil {
		return err
	}
	if err := m.checkIP(ip); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	host := m.hostVethName(id)
	path := m.NSPath(id)
	link, err := m.sandboxVeth(id, host)
	if err != nil {
		return err
	}
	if link == nil {
		if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
			m.forgetNeighbour(ip) // a pin a failed Attach made
			return nil            // torn down, or never set up
		}
	}
	if err := blockAddr(ip); err != nil {
		return err
	}
	m.forgetNeighbour(ip)
	if link != nil {
		if err := netlink.LinkDel(link); err != nil && !isNotFound(err) {
			return fmt.Errorf("network: delete veth %s: %v: %w", host, err, errdefs.ErrInternal)
		}
	}
	if err := unmountNetns(path); err != nil {
		return err
	}
	m.log.Debug("sandbox network detached", slog.String("sandbox", id))
	return nil
}

// Attach gives sandbox id, detached, its network again, as itself: a netns
// on its netns file, a veth pair on an isolated bridge port, eth0 at its
// address with its route (the sandbox restored into it takes the
// interface over, as a memory fork's child does), the port's elements for
// egress mode, and the address pinned and unblocked. One that still has
// its veth (attached already, a crash between the two; or detached by a
// daemon that kept the pair) is attached with it. A full bridge is
// ResourceExhausted, and leaves it detached; a sandbox without a netns
// file (torn down, or never set up) is NotFound.
func (m *Manager) Attach(ctx context.Context, id string, ip netip.Addr, egress Egress) (err error) {
	if err := validID(id); err != nil {
		return err
	}
	if err := m.checkIP(ip); err != nil {
		return err
	}
	if egress == "" {
		egress = EgressNone
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if egress != EgressNone {
		if err := m.enableForwarding(); err != nil {
			return err
		}
	}
	path := m.NSPath(id)
	if _, err := os.Stat(path); err != nil {
		return fmt.Errorf("network: netns of %s: %v: %w", id, err, errdefs.ErrNotFound)
	}
	defer func() {
		if err != nil { // what was made here goes: it stays detached
			err = errors.Join(err, m.Detach(context.WithoutCancel(ctx), id, ip))
		}
	}()
	mounted, err := netnsMounted(path)
	if err != nil {
		return err
	}
	if !mounted {
		if err := mountNetns(path); err != nil {
			return err
		}
	}
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return fmt.Errorf("network: netns of %s: %v: %w", id, err, errdefs.ErrInternal)
	}
	defer ns.Close()
	host := m.hostVethName(id)
	var mac net.HardwareAddr
	link, err := m.sandboxVeth(id, host)
	switch {
	case err != nil:
		return err
	case link == nil:
		var undo cleanup // only for a half-made pair
		if mac, err = m.plugIn(id, host, ns, ip, &undo); err != nil {
			return errors.Join(err, undo.run())
		}
	default:
		if err := m.joinBridge(link); err != nil {
			return err
		}
		if mac, err = configureInside(ns, ip, m.gateway, m.cfg.Subnet.Bits()); err != nil {
			return err
		}
	}
	if err := m.addElements(host, ip, egress); err != nil {
		return err
	}
	if err := m.bringUp(ctx, host, ip, mac); err != nil {
		return err
	}
	m.log.Debug("sandbox network attached", slog.String("sandbox", id), slog.String("ip", ip.String()))
	return nil
}

// Teardown removes everything Setup made for sandbox id: nftables
// elements, the veth pair, the netns bind mount and file. It is
// idempotent; an id with nothing left is not an error.
func (m *Manager) Teardown(ctx context.Context, id string) error {
	if err := validID(id); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	host := m.hostVethName(id)
	err := errors.Join(
		m.delElements(host),
		delVeth(host),
		removeNetns(m.NSPath(id)),
	)
	if err != nil {
		return err
	}
	m.log.Debug("sandbox network torn down", slog.String("sandbox", id))
	return nil
}

// sandboxVeth returns sandbox id's host veth, named host; nil when it has
// none. One with no alias is a pair half made, by a daemon that died
// between its creation and its alias (addVeth): no one else names a veth
// so, and it is deleted (nil returned), so that the sandbox gets a whole
// pair; before, every wake of the sandbox failed on it. One with another
// sandbox's alias is an error.
func (m *Manager) sandboxVeth(id, host string) (netlink.Link, error) {
	link, err := netlink.LinkByName(host)
	switch {
	case isNotFound(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("network: veth %s: %v: %w", host, err, errdefs.ErrInternal)
	case link.Attrs().Alias == "":
		m.log.Warn("network: a veth left half made (no alias) is deleted", slog.String("sandbox", id), slog.String("link", host))
		if err := netlink.LinkDel(link); err != nil && !isNotFound(err) {
			return nil, fmt.Errorf("network: delete half-made veth %s: %v: %w", host, err, errdefs.ErrInternal)
		}
		return nil, nil
	case link.Attrs().Alias != aliasPrefix+id:
		return nil, fmt.Errorf("network: veth %s is %q's, not sandbox %s's: %w", host, link.Attrs().Alias, id, errdefs.ErrInternal)
	}
	return link, nil
}

// List returns the ids of the sandboxes that have a network here, sorted:
// those with a netns file, and those whose host veth is left without one
// (found by the veth's alias). A veth of ours without an alias is logged.
func (m *Manager) List(ctx context.Context) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	ids := map[string]bool{}
	entries, err := os.ReadDir(m.cfg.NetnsDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("network: read %s: %v: %w", m.cfg.NetnsDir, err, errdefs.ErrInternal)
	}
	for _, e := range entries {
		if validID(e.Name()) == nil {
			ids[e.Name()] = true
		}
	}
	veths, err := m.ourVeths()
	if err != nil {
		return nil, err
	}
	for name, id := range veths {
		switch {
		case id == "" || validID(id) != nil || m.hostVethName(id) != name:
			m.log.Warn("veth with a forkbox name but no sandbox id", slog.String("link", name))
		default:
			ids[id] = true
		}
	}
	out := make([]string, 0, len(ids))
	for id := range ids {
		out = append(out, id)
	}
	sort.Strings(out)
	return out, nil
}

// Reconfigure gives sandbox id's eth0 its address and default route again.
// gVisor takes them over when it starts (its netstack owns the interface),
// so a sandbox restored from a memory image into its own netns needs them
// put back first. Idempotent.
func (m *Manager) Reconfigure(ctx context.Context, id string, ip netip.Addr) error {
	if err := validID(id); err != nil {
		return err
	}
	if err := m.checkIP(ip); err != nil {
		return err
	}
	ns, err := netns.GetFromPath(m.NSPath(id))
	if err != nil {
		return fmt.Errorf("network: netns of %s: %v: %w", id, err, errdefs.ErrNotFound)
	}
	defer ns.Close()
	mac, err := configureInside(ns, ip, m.gateway, m.cfg.Subnet.Bits())
	if err != nil {
		return err
	}
	return m.pinNeighbour(m.hostVethName(id), ip, mac)
}
