// Test helpers on top of the shared fixtures in runtime/testsuite: the
// runsc prerequisites, a fixture that keeps the *Runsc (for Checkpoint and
// Restore), a veth pair into a test netns, a TCP dial from a netns, and
// checks for host state left behind by a sandbox.

package runsc

import (
	"io"
	"net"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/forkbox/forkbox/internal/runtime/spec"
	"github.com/forkbox/forkbox/internal/runtime/testsuite"
)

// requireRunsc checks root, busybox and runsc, plus the cgroup v1 memory
// controller these tests read limits from.
func requireRunsc(t *testing.T) {
	t.Helper()
	testsuite.RequireRoot(t, "runsc")
	_, err := os.Stat("/sys/fs/cgroup/memory")
	testsuite.Need(t, err == nil, "cgroup v1 memory controller not mounted")
}

// fixture is a testsuite.Fixture whose runtime is a *Runsc.
type fixture struct {
	*testsuite.Fixture
	rt *Runsc
}

// newFixture starts a runsc driver from o with newRuntime and prepares a
// rootfs, netns and bundle for one container with testsuite.NewFixture,
// which registers the cleanup.
func newFixture(t *testing.T, o Options, so spec.SpecOptions) *fixture {
	t.Helper()
	requireRunsc(t)
	rt := newRuntime(t, o)
	return &fixture{Fixture: testsuite.NewFixture(t, rt, so), rt: rt}
}

// newRuntime is a driver from o with its state root and log dir in a temp
// dir unless set, closed in Cleanup (after its containers' cleanups, which
// are registered later).
func newRuntime(t *testing.T, o Options) *Runsc {
	t.Helper()
	tmp := t.TempDir()
	if o.Root == "" {
		o.Root = filepath.Join(tmp, "state")
	}
	if o.LogDir == "" {
		o.LogDir = filepath.Join(tmp, "logs")
	}
	rt, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close() })
	return rt
}

// hostProcsWith returns the host pids whose cmdline mentions s.
func hostProcsWith(s string) []string {
	var pids []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if e.Name()[0] < '0' || e.Name()[0] > '9' {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(b), s) {
			pids = append(pids, e.Name()+":"+strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
	return pids
}

// veth puts eth0 (sbAddr) in the netns at sbPath and its peer0 (peerAddr)
// in a new test netns, returned as a handle closed in Cleanup.
func veth(t *testing.T, sbPath, sbAddr, peerAddr string) netns.NsHandle {
	t.Helper()
	peer := testsuite.Netns(t)
	sbNS, err := netns.GetFromPath(sbPath)
	if err != nil {
		t.Fatal(err)
	}
	defer sbNS.Close()
	peerNS, err := netns.GetFromPath(peer)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { peerNS.Close() })
	hs, _ := netlink.NewHandleAt(sbNS)
	defer hs.Close()
	if err := hs.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0"}, PeerName: "peer0", PeerNamespace: netlink.NsFd(peerNS)}); err != nil {
		t.Fatalf("veth: %v", err)
	}
	hp, _ := netlink.NewHandleAt(peerNS)
	defer hp.Close()
	for _, c := range []struct {
		h          *netlink.Handle
		name, addr string
	}{{hs, "eth0", sbAddr}, {hp, "peer0", peerAddr}} {
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
	return peerNS
}

// tryDial connects to addr from inside ns, retrying until timeout, and
// returns what the server sends.
func tryDial(ns netns.NsHandle, addr string, timeout time.Duration) (string, error) {
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
	return r.s, r.err
}
