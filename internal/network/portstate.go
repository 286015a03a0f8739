package network

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/vishvananda/netlink"
)

// A veth that was just brought up is not yet a forwarding port of the
// bridge: the kernel enables the port when its link watcher has seen the
// carrier (a work item, later on a loaded host), and until then the bridge
// drops what crosses it. A sandbox's first packets (the daemon's first SYN
// to its agent, which then waits a second for the retransmit; a first DNS
// query; a UDP datagram, lost for good) went nowhere. Setup returns only
// once the port forwards.

// portWait bounds the wait for a port to forward.
const portWait = 30 * time.Second

// brForwarding is BR_STATE_FORWARDING in /sys/class/net/PORT/brport/state.
const brForwarding = "3"

// sysClassNet is where portForwarding reads a port's state.
var sysClassNet = "/sys/class/net"

// portForwarding reports whether the bridge port host forwards, by the
// kernel's word: its state in sysfs. A daemon in a network namespace other
// than the one /sys was mounted in (a node of the cluster tests, entered
// with nsenter) finds no such file there; it goes by the port's operational
// state (netlink), which the kernel sets up in the same link-watch step
// just before it enables the port.
func portForwarding(host string) (bool, error) {
	b, err := os.ReadFile(filepath.Join(sysClassNet, host, "brport", "state"))
	if err == nil {
		return strings.TrimSpace(string(b)) == brForwarding, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return false, fmt.Errorf("network: state of bridge port %s: %v: %w", host, err, errdefs.ErrInternal)
	}
	link, lerr := netlink.LinkByName(host)
	if lerr != nil {
		return false, fmt.Errorf("network: bridge port %s: %v: %w", host, lerr, errdefs.ErrInternal)
	}
	return link.Attrs().OperState == netlink.OperUp, nil
}

// waitForwarding waits until the bridge port host forwards. It listens to
// the kernel's link notifications (a port's state change is one) and reads
// the state again on each, so it wakes when the state changes, not on a
// timer.
func waitForwarding(ctx context.Context, host string) error {
	if ok, err := portForwarding(host); ok || err != nil {
		return err
	}
	ch := make(chan netlink.LinkUpdate, 16)
	done := make(chan struct{})
	if err := netlink.LinkSubscribe(ch, done); err != nil {
		return fmt.Errorf("network: watch links: %v: %w", err, errdefs.ErrInternal)
	}
	defer func() {
		close(done)
		for range ch { // the subscription's reader ends once its socket is closed
		}
	}()
	ctx, cancel := context.WithTimeout(ctx, portWait)
	defer cancel()
	for {
		// Subscribed first, read second: a change between the two is
		// still seen as a notification.
		if ok, err := portForwarding(host); ok || err != nil {
			return err
		}
		select {
		case _, open := <-ch:
			if !open {
				return fmt.Errorf("network: link notifications ended before %s forwarded: %w", host, errdefs.ErrInternal)
			}
		case <-ctx.Done():
			if ctx.Err() == context.DeadlineExceeded {
				return fmt.Errorf("network: bridge port %s does not forward after %s: %w", host, portWait, errdefs.ErrUnavailable)
			}
			return ctx.Err()
		}
	}
}
