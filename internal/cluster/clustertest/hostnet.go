package clustertest

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/forkbox/forkbox/internal/network"
)

// The nodes' network: one host bridge (the "LAN") with an address on the
// host, and per node a network namespace whose eth0 is a veth attached to
// that bridge, with an address of its own and a default route through the
// host. A node's daemon runs inside its namespace, so its bridge, nftables
// table and sandbox veths live there, and it is reached at its own
// address, as on a real host.

// hostNet is the host side of a cluster's network.
type hostNet struct {
	bridge string       // host bridge
	prefix netip.Prefix // its /24; .1 is the host, .10+i node i
}

// ip runs the ip command, bounded in time.
func ip(ctx context.Context, args ...string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// freeLAN returns a 10.215.X.0/24 that no host route covers, starting at
// a slot derived from seed (two runs at once take different ones).
func freeLAN(ctx context.Context, seed int) (netip.Prefix, error) {
	out, err := exec.CommandContext(ctx, "ip", "-4", "route", "show", "table", "all").Output()
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("ip route: %w", err)
	}
	routes := string(out)
	for k := range 200 {
		p := netip.MustParsePrefix(fmt.Sprintf("10.215.%d.0/24", 20+(seed+k)%200))
		if !strings.Contains(routes, p.String()) {
			return p, nil
		}
	}
	return netip.Prefix{}, errors.New("no free 10.215.X.0/24 for the nodes' network")
}

// addr is the address of host (0) or node i (i+1) on the bridge.
func (h *hostNet) addr(i int) netip.Addr {
	a := h.prefix.Addr().As4()
	if i < 0 {
		a[3] = 1
	} else {
		a[3] = byte(10 + i)
	}
	return netip.AddrFrom4(a)
}

func setupHostNet(ctx context.Context, bridge string, seed int) (*hostNet, error) {
	p, err := freeLAN(ctx, seed)
	if err != nil {
		return nil, err
	}
	h := &hostNet{bridge: bridge, prefix: p}
	if err := ip(ctx, "link", "add", bridge, "type", "bridge"); err != nil {
		return nil, err
	}
	for _, args := range [][]string{
		{"addr", "add", h.addr(-1).String() + "/24", "dev", bridge},
		{"link", "set", bridge, "up"},
	} {
		if err := ip(ctx, args...); err != nil {
			ip(ctx, "link", "del", bridge)
			return nil, err
		}
	}
	return h, nil
}

func (h *hostNet) destroy(ctx context.Context) error {
	if _, err := os.Stat("/sys/class/net/" + h.bridge); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return ip(ctx, "link", "del", h.bridge)
}

// addNode makes node i's namespace ns with eth0 on the bridge.
func (h *hostNet) addNode(ctx context.Context, i int, ns, hostVeth string) error {
	peer := hostVeth + "p"
	if err := ip(ctx, "netns", "add", ns); err != nil {
		return err
	}
	steps := [][]string{
		{"link", "add", hostVeth, "type", "veth", "peer", "name", peer},
		{"link", "set", peer, "netns", ns},
		{"link", "set", hostVeth, "master", h.bridge, "up"},
		{"-n", ns, "link", "set", "lo", "up"},
		{"-n", ns, "link", "set", peer, "name", "eth0"},
		{"-n", ns, "addr", "add", h.addr(i).String() + "/24", "dev", "eth0"},
		{"-n", ns, "link", "set", "eth0", "up"},
		{"-n", ns, "route", "add", "default", "via", h.addr(-1).String()},
	}
	for _, args := range steps {
		if err := ip(ctx, args...); err != nil {
			h.delNode(ctx, ns, hostVeth)
			return err
		}
	}
	return nil
}

// delNode deletes node namespace ns and its veth pair (hostVeth on the
// host): the pair is deleted first, because the kernel frees a namespace
// (and the links in it) only some time after its last reference goes.
func (h *hostNet) delNode(ctx context.Context, ns, hostVeth string) error {
	var errs []error
	if _, err := os.Stat("/sys/class/net/" + hostVeth); err == nil {
		errs = append(errs, ip(ctx, "link", "del", hostVeth))
	}
	if _, err := os.Stat(filepath.Join("/run/netns", ns)); err == nil {
		errs = append(errs, ip(ctx, "netns", "del", ns))
	}
	return errors.Join(errs...)
}

// nsRecord is the name of the forwarding record a daemon in namespace
// ns keeps (see network.NetnsRecordName).
func nsRecord(ns string) string {
	st, err := os.Stat(filepath.Join("/run/netns", ns))
	if err != nil {
		return ""
	}
	return network.NetnsRecordName(st)
}
