package network

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netns"
)

func skipOrFail(tb testing.TB, reason string) {
	tb.Helper()
	if os.Getenv("CI") == "true" {
		tb.Fatal(reason)
	}
	tb.Skip(reason)
}

func requirePrivileges(tb testing.TB) {
	tb.Helper()
	if os.Geteuid() != 0 {
		skipOrFail(tb, "needs root")
	}
	c, err := nftables.New()
	if err == nil {
		_, err = c.ListTables()
	}
	if err != nil {
		skipOrFail(tb, fmt.Sprintf("nftables not usable: %v", err))
	}
}

// newTestManager returns a Manager on its own bridge, table, netns dir and
// subnet 10.231.<n>.0/24, destroyed with everything in it at cleanup.
func newTestManager(tb testing.TB, n int) *Manager {
	tb.Helper()
	return newTestManagerIn(tb, n, netip.MustParsePrefix(fmt.Sprintf("10.231.%d.0/24", n)))
}

// newTestManagerIn is newTestManager with its own subnet.
func newTestManagerIn(tb testing.TB, n int, subnet netip.Prefix) *Manager {
	tb.Helper()
	requirePrivileges(tb)
	// Setup with egress "all" turns IPv4 forwarding on; Destroy at
	// cleanup gives the Manager's hold up, and the last holder restores
	// the host's value. (Writing the value back directly, as this did,
	// switched forwarding off under a daemon of the e2e tests running at
	// the same time.)
	cfg := Config{
		Bridge:     fmt.Sprintf("fbt%d-%d", os.Getpid()%100000, n),
		Subnet:     subnet,
		NetnsDir:   tb.TempDir() + "/netns",
		Table:      fmt.Sprintf("forkbox_test_%d_%d", os.Getpid(), n),
		VethPrefix: fmt.Sprintf("ft%02d", n),
		Log:        slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	m, err := New(context.Background(), cfg)
	if err != nil {
		// New does not unwind what it made (the bridge, tables and dir
		// mount may be shared); a test does.
		m := &Manager{cfg: cfg}
		m.cfg.Subnet, m.cfg.VethPrefix = cfg.Subnet, cfg.VethPrefix
		tb.Cleanup(func() { m.Destroy(context.Background()) })
		tb.Fatalf("New: %v", err)
	}
	tb.Cleanup(func() {
		ctx := context.Background()
		ids, err := m.List(ctx)
		if err != nil {
			tb.Errorf("List: %v", err)
		}
		for _, id := range ids {
			if err := m.Teardown(ctx, id); err != nil {
				tb.Errorf("Teardown(%s): %v", id, err)
			}
		}
		if err := m.Destroy(ctx); err != nil {
			tb.Errorf("Destroy: %v", err)
		}
	})
	return m
}

// testID returns a sandbox id unique to this test process.
func testID(name string) string { return fmt.Sprintf("t%d-%s", os.Getpid(), name) }

func setup(tb testing.TB, m *Manager, name string, egress Egress) *Network {
	tb.Helper()
	return setupWith(tb, m, name, Policy{Mode: egress})
}

// setupWith sets up a sandbox network with policy pol at the next free
// address; the test tears it down itself.
func setupWith(tb testing.TB, m *Manager, name string, pol Policy) *Network {
	tb.Helper()
	var used []netip.Addr
	ids, err := m.List(context.Background())
	if err != nil {
		tb.Fatal(err)
	}
	for range ids {
		a, _ := allocateAfter(m.cfg.Subnet, used, netip.Addr{})
		used = append(used, a)
	}
	ip, err := allocateAfter(m.cfg.Subnet, used, netip.Addr{})
	if err != nil {
		tb.Fatal(err)
	}
	nw, err := m.Setup(context.Background(), testID(name), ip, pol)
	if err != nil {
		tb.Fatalf("Setup(%s): %v", name, err)
	}
	return nw
}

// inNetns runs fn on a thread that is inside the netns at path.
func inNetns(path string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer orig.Close()
		target, err := netns.GetFromPath(path)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer target.Close()
		if err := netns.Set(target); err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		ferr := fn()
		if err := netns.Set(orig); err != nil {
			errc <- fmt.Errorf("restore netns: %v (thread discarded)", err)
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// listenIn opens a TCP listener on addr inside the netns at path (or in
// the host netns if path is ""), answering each connection with "ok\n".
func listenIn(tb testing.TB, path, addr string) net.Listener {
	tb.Helper()
	var l net.Listener
	listen := func() (err error) { l, err = net.Listen("tcp4", addr); return err }
	var err error
	if path == "" {
		err = listen()
	} else {
		err = inNetns(path, listen)
	}
	if err != nil {
		tb.Fatalf("listen on %s: %v", addr, err)
	}
	tb.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("ok\n"))
			c.Close()
		}
	}()
	return l
}

// dial connects to addr from the netns at path (host if "") and reads the
// greeting. It returns nil only if a full exchange worked.
func dial(path, addr string) error {
	var c net.Conn
	d := func() (err error) { c, err = net.DialTimeout("tcp4", addr, 1500*time.Millisecond); return err }
	var err error
	if path == "" {
		err = d()
	} else {
		err = inNetns(path, d)
	}
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(1500 * time.Millisecond))
	buf := make([]byte, 3)
	if _, err := io.ReadFull(c, buf); err != nil {
		return err
	}
	if string(buf) != "ok\n" {
		return fmt.Errorf("got %q, want ok", buf)
	}
	return nil
}

// nftTables returns the inet and bridge tables of that name, as nft lists them.
func nftTables(tb testing.TB, table string) string {
	tb.Helper()
	var out []byte
	for _, fam := range []string{"inet", "bridge"} {
		b, err := exec.Command("nft", "list", "table", fam, table).CombinedOutput()
		if err != nil {
			tb.Fatalf("nft list table %s %s: %v: %s", fam, table, err, b)
		}
		out = append(out, b...)
	}
	return string(out)
}
