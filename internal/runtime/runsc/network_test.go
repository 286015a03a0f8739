// Network test: a sandbox in a netns with a veth address serves TCP to a
// peer netns (both created by the test), with --network=sandbox.

package runsc

import (
	"context"
	"io"
	"net"
	goruntime "runtime"
	"testing"
	"time"

	"github.com/forkbox/forkbox/internal/runtime/spec"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

func TestNetworkSandbox(t *testing.T) {
	f := newFixture(t, Options{}, spec.SpecOptions{
		Args: []string{"/bin/sh", "-c", "while true; do echo hello | nc -l -p 8080; done"},
	})
	peer := testNetns(t)
	sbNS, err := netns.GetFromPath(f.netns)
	if err != nil {
		t.Fatal(err)
	}
	defer sbNS.Close()
	peerNS, err := netns.GetFromPath(peer)
	if err != nil {
		t.Fatal(err)
	}
	defer peerNS.Close()

	// veth: eth0 (10.231.7.2) in the sandbox netns, peer0 (10.231.7.1) in
	// the peer netns.
	hs, _ := netlink.NewHandleAt(sbNS)
	defer hs.Close()
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0"}, PeerName: "peer0", PeerNamespace: netlink.NsFd(peerNS)}
	if err := hs.LinkAdd(veth); err != nil {
		t.Fatalf("veth: %v", err)
	}
	hp, _ := netlink.NewHandleAt(peerNS)
	defer hp.Close()
	for _, c := range []struct {
		h    *netlink.Handle
		name string
		addr string
	}{{hs, "eth0", "10.231.7.2/24"}, {hp, "peer0", "10.231.7.1/24"}} {
		l, err := c.h.LinkByName(c.name)
		if err != nil {
			t.Fatal(err)
		}
		a, _ := netlink.ParseAddr(c.addr)
		if err := c.h.AddrAdd(l, a); err != nil {
			t.Fatal(err)
		}
		if err := c.h.LinkSetUp(l); err != nil {
			t.Fatal(err)
		}
	}

	if err := f.rt.Run(context.Background(), f.id, f.bundle); err != nil {
		t.Fatalf("run: %v", err)
	}
	got := dialFrom(t, peerNS, "10.231.7.2:8080", 10*time.Second)
	if got != "hello\n" {
		t.Errorf("read %q from the sandbox, want %q", got, "hello\n")
	}
}

// dialFrom connects to addr from inside ns, retrying until timeout, and
// returns what the server sends.
func dialFrom(t *testing.T, ns netns.NsHandle, addr string, timeout time.Duration) string {
	t.Helper()
	type result struct {
		s   string
		err error
	}
	ch := make(chan result, 1)
	go func() {
		goruntime.LockOSThread() // the thread stays in ns and dies with the goroutine
		if err := netns.Set(ns); err != nil {
			ch <- result{err: err}
			return
		}
		deadline := time.Now().Add(timeout)
		for {
			c, err := net.DialTimeout("tcp", addr, time.Second)
			if err == nil {
				c.SetDeadline(time.Now().Add(5 * time.Second))
				b, err := io.ReadAll(c)
				c.Close()
				if err == nil && len(b) > 0 {
					ch <- result{s: string(b)}
					return
				}
			}
			if time.Now().After(deadline) {
				ch <- result{err: err}
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
	r := <-ch
	if r.err != nil {
		t.Fatalf("dial %s: %v", addr, r.err)
	}
	return r.s
}
