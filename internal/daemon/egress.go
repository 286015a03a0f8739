package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/dnsproxy"
	"github.com/forkbox/forkbox/internal/network"
	"github.com/forkbox/forkbox/internal/store"
	"github.com/miekg/dns"
)

// Egress policies: a sandbox's config holds its mode and lists (checked by
// network.ParsePolicy on the way in); the network applies them; the DNS
// proxy serves the names on allow lists.

// policyOf reads the egress policy of a sandbox's config.
func policyOf(cfg store.SandboxConfig) (network.Policy, error) {
	pol, err := network.ParsePolicy(cfg.Egress, cfg.EgressAllow, cfg.EgressDeny)
	if err != nil {
		return network.Policy{}, fmt.Errorf("the recorded egress policy: %w", err)
	}
	return pol, nil
}

// egressMode is the mode of a sandbox's recorded policy, "none" when it
// does not parse (the sandbox still wakes, and reaches nothing outside).
func egressMode(cfg store.SandboxConfig) network.Egress {
	if pol, err := policyOf(cfg); err == nil {
		return pol.Mode
	}
	return network.EgressNone
}

// EgressOptions is a new egress policy for a live sandbox: a mode ("none",
// "all", "allow" or "" = "allow" with a list, else "none") and its lists.
type EgressOptions struct {
	Egress      string
	Allow, Deny []string
}

// SetEgress replaces the egress policy of a live sandbox (running, paused,
// hibernated or degraded). The config is recorded first: a crash before
// the network has it is put right by reconcile, which applies every live
// sandbox's recorded policy. Addresses resolved under the old policy no
// longer pass, and open connections the new policy would not let start are
// cut (their conntrack entries deleted); those it allows stay open.
func (d *Daemon) SetEgress(ctx context.Context, idOrName string, o EgressOptions) (*store.Sandbox, error) {
	pol, err := network.ParsePolicy(o.Egress, o.Allow, o.Deny)
	if err != nil {
		return nil, err
	}
	if err := d.requireDNS(pol); err != nil {
		return nil, err
	}
	sb, unlock, err := d.locked(ctx, idOrName)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if err := requireState(sb, "change the egress of", store.StateRunning, store.StatePaused, store.StateHibernated, store.StateDegraded); err != nil {
		return nil, err
	}
	cfg := sb.Config
	cfg.Egress = string(pol.Mode)
	cfg.EgressAllow, cfg.EgressDeny = pol.Lists()
	if err := d.store.SetSandboxConfig(ctx, sb.ID, cfg); err != nil {
		return nil, err
	}
	sb.Config = cfg
	if err := d.net.SetPolicy(ctx, sb.ID, netip.MustParseAddr(sb.IP), pol); err != nil {
		return nil, fmt.Errorf("egress: %w", err)
	}
	d.note(ctx, sb.ID, store.EventEgressChanged, map[string]any{"egress": cfg.Egress, "allow": cfg.EgressAllow, "deny": cfg.EgressDeny})
	d.log.Info("egress changed", slog.String("sandbox", sb.ID), slog.String("egress", cfg.Egress),
		slog.Int("allow", len(cfg.EgressAllow)), slog.Int("deny", len(cfg.EgressDeny)))
	return sb, nil
}

// requireDNS fails with Unavailable when pol has names and the DNS proxy
// did not start: the sandbox would be let through to port 53 of the
// gateway, where some other resolver of the host may listen.
func (d *Daemon) requireDNS(pol network.Policy) error {
	if pol.HasNames() && d.dnsErr != nil {
		return fmt.Errorf("egress allow lists with names need the DNS proxy, which did not start (%v): give CIDRs only, or fix the proxy (--dns-upstream) and restart the daemon: %w", d.dnsErr, errdefs.ErrUnavailable)
	}
	return nil
}

// reapplyEgress gives the network a sandbox's recorded policy again (on
// restart: the DNS proxy's view of it lives in memory). Without the proxy,
// a policy with names is applied without them (its CIDRs only).
func (d *Daemon) reapplyEgress(ctx context.Context, sb *store.Sandbox) error {
	pol, err := policyOf(sb.Config)
	if err != nil {
		return err
	}
	if d.requireDNS(pol) != nil {
		d.log.Warn("dns proxy not running: the names on the sandbox's allow list do not resolve", slog.String("sandbox", sb.ID))
		pol = pol.WithoutNames()
	}
	return d.net.SetPolicy(ctx, sb.ID, netip.MustParseAddr(sb.IP), pol)
}

// startDNSProxy starts the DNS proxy on the gateway, port 53, bound to the
// bridge, forwarding to cfg.DNSUpstream or the host's first resolver. A
// proxy that cannot start is logged, not fatal: sandboxes with only CIDRs
// on their lists are not affected; lists with names are refused
// (requireDNS).
func (d *Daemon) startDNSProxy(ctx context.Context, nm *network.Manager) {
	upstream := d.cfg.DNSUpstream
	if upstream == "" {
		cc, err := dns.ClientConfigFromFile("/etc/resolv.conf")
		if err != nil || len(cc.Servers) == 0 {
			d.dnsErr = fmt.Errorf("no upstream resolver in /etc/resolv.conf (give --dns-upstream): %v", err)
			d.log.Warn("dns proxy: not started: egress allow lists with names are refused", slog.Any("error", d.dnsErr))
			return
		}
		upstream = net.JoinHostPort(cc.Servers[0], cc.Port)
	}
	p, err := dnsproxy.Start(ctx, dnsproxy.Config{Listen: netip.AddrPortFrom(nm.Gateway(), 53), Device: nm.Bridge(), Clients: nm.Subnet(),
		Upstream: upstream, Policies: nm, MatchName: network.MatchName, Log: d.log})
	if err != nil {
		d.dnsErr = err
		d.log.Error("dns proxy: not started: egress allow lists with names are refused", slog.Any("error", err))
		return
	}
	d.dns, d.dnsErr = p, nil
}

// nameservers are the resolvers in a sandbox's /etc/resolv.conf: the DNS
// proxy on the gateway, whatever the sandbox's egress (the file cannot
// change under a running sandbox, its policy can). Sandboxes that are not
// the proxy's clients get "port unreachable" at once.
func nameservers(nw *network.Network) []string { return []string{nw.Gateway.String()} }

// checkUpstream checks a --dns-upstream value: host:port.
func checkUpstream(s string) error {
	if s == "" {
		return nil
	}
	if _, err := netip.ParseAddrPort(s); err != nil {
		return fmt.Errorf("dns upstream %q: want ip:port: %w", s, errdefs.ErrInvalidArgument)
	}
	return nil
}
