package daemon

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/ports"
	"github.com/forkbox/forkbox/internal/store"
)

// Preview ports: with Config.PortsAddr set, the daemon serves a preview
// listener (package ports) that proxies to a sandbox's ports at its own
// address on the bridge, after the sandbox's port token. A request to a
// hibernated sandbox wakes it; a proxied request (or WebSocket, or tunnel)
// keeps the sandbox busy for idle hibernation while it lasts. No ledger
// event is written per request.

// startPorts opens the port-token secret and, if configured, the listener.
func (d *Daemon) startPorts() error {
	keys, err := ports.OpenKeys(d.cfg.StateDir)
	if err != nil {
		return err
	}
	d.portKeys = keys
	if d.cfg.PortsAddr == "" {
		return nil
	}
	h := ports.NewHandler(portBackend{d}, ports.Options{Keys: keys, APIToken: d.cfg.APIToken, Log: d.log, Domain: d.cfg.PortsDomain})
	d.portSrv, err = ports.Listen(d.cfg.PortsAddr, h, d.log)
	return err
}

// portBackend is the daemon as the preview handler's Backend.
type portBackend struct{ d *Daemon }

func (b portBackend) Target(ctx context.Context, id string, port int) (ports.Target, func(), error) {
	addr, done, err := b.d.PortTarget(ctx, id, port)
	return ports.Target{Addr: addr}, done, err
}

// PortTarget returns the address of port in sandbox id (an ID, not a name:
// the token is the ID's), woken if hibernated and marked busy until done.
func (d *Daemon) PortTarget(ctx context.Context, id string, port int) (addr string, done func(), err error) {
	if err := ports.CheckPort(port); err != nil {
		return "", nil, err
	}
	sb, err := d.store.GetSandbox(ctx, id)
	if err != nil {
		return "", nil, err
	}
	if sb.ID != id || sb.State == store.StateClosed || sb.State == store.StateClosing {
		return "", nil, fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	if sb.State == store.StatePaused {
		return "", nil, fmt.Errorf("sandbox %s is paused: unpause it to reach its ports: %w", id, errdefs.ErrFailedPrecondition)
	}
	sb, done, err = d.running(ctx, sb.ID)
	if err != nil {
		return "", nil, err
	}
	ip, err := netip.ParseAddr(sb.IP)
	if err != nil {
		done()
		return "", nil, fmt.Errorf("sandbox %s has no address: %w", id, errdefs.ErrUnavailable)
	}
	return netip.AddrPortFrom(ip, uint16(port)).String(), done, nil
}

// PortURL returns the preview URLs of a port of a live sandbox.
func (d *Daemon) PortURL(ctx context.Context, idOrName string, port int) (ports.URLs, error) {
	if err := ports.CheckPort(port); err != nil {
		return ports.URLs{}, err
	}
	sb, err := d.store.GetSandbox(ctx, idOrName)
	if err != nil {
		return ports.URLs{}, err
	}
	if sb.State == store.StateClosed || sb.State == store.StateClosing {
		return ports.URLs{}, fmt.Errorf("sandbox %s is %s: %w", sb.ID, sb.State, errdefs.ErrNotFound)
	}
	if d.portSrv == nil {
		return ports.URLs{}, fmt.Errorf("the daemon serves no preview URLs (start it with `forkbox serve --ports ADDR`): %w", errdefs.ErrFailedPrecondition)
	}
	return ports.BuildURLs(d.portSrv.Addr(), d.cfg.PortsDomain, sb.ID, port, d.portKeys.Token(sb.ID)), nil
}

// PortsAddr is the address the preview listener is bound to ("" without
// one).
func (d *Daemon) PortsAddr() string {
	if d.portSrv == nil {
		return ""
	}
	return d.portSrv.Addr()
}
