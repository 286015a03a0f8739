package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/freeport"
	"github.com/forkbox/forkbox/internal/network"
	"github.com/forkbox/forkbox/internal/snapshot/btrfs"
)

// The throwaway daemon's host names are its own per run (from the bench's
// pid), distinct from the default daemon's, the e2e suite's and another
// bench run's, so that they all run beside each other on one host.
const (
	benchMaxSandboxes = 150
	benchBtrfsSize    = "32Gi"
)

// hostNames are the names and the subnet of one run's daemon.
type hostNames struct {
	bridge, table, veth, subnet, cgroup string
}

// namesFor derives the names from n (the pid): one of 128 /20 subnets in
// 10.216.0.0/13 (4,094 addresses: the density section's thousand and
// more), away from the default daemon's 10.88/16, e2e's 10.213 and the
// unit tests' 10.23x.
func namesFor(n int) hostNames {
	slot := n % 128
	return hostNames{
		bridge: fmt.Sprintf("fbxb%d", n%100000),
		table:  fmt.Sprintf("forkbox_bench_%d", n),
		veth:   fmt.Sprintf("fb%02d", n%100),
		subnet: benchSlot(slot).String(),
		cgroup: fmt.Sprintf("forkbox-bench-%d", n),
	}
}

// benchSlot is the i-th /20 of 10.216.0.0/13 (i mod 128).
func benchSlot(i int) netip.Prefix { return benchSlotOf(i, 20) }

// benchSlotOf is the i-th /bits of 10.216.0.0/13 (i mod their count).
func benchSlotOf(i, bits int) netip.Prefix {
	n := 1 << (bits - 13)
	i = ((i % n) + n) % n
	a := uint32(10<<24|216<<16) + uint32(i)<<(32-bits)
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(a >> 24), byte(a >> 16), byte(a >> 8), byte(a)}), bits)
}

// forAddresses widens h's subnet, when need addresses do not fit in a
// /20 (the density section's sessions), to the smallest slot of
// 10.216.0.0/13 that holds them (a /16 at most: 65,533), the one that
// holds h's /20.
func (h hostNames) forAddresses(need int) hostNames {
	p := netip.MustParsePrefix(h.subnet)
	bits := p.Bits()
	for bits > 16 && 1<<(32-bits)-3 < need {
		bits--
	}
	h.subnet = netip.PrefixFrom(p.Addr(), bits).Masked().String()
	return h
}

// freeSubnet returns the first slot, of h's size, from h's on, that
// overlaps none of the host's routes (another daemon's or test's subnet),
// or h's own when all do.
func (h hostNames) freeSubnet(routes []netip.Prefix) string {
	start := netip.MustParsePrefix(h.subnet)
	bits := start.Bits()
	a := start.Addr().As4()
	first := int((uint32(a[1]-216)<<16 | uint32(a[2])<<8 | uint32(a[3])) >> (32 - bits))
	for i := range 1 << (bits - 13) {
		if p := benchSlotOf(first+i, bits); !slices.ContainsFunc(routes, p.Overlaps) {
			return p.String()
		}
	}
	return h.subnet
}

// daemon is a throwaway `forkbox serve` with its own state, run dir, socket,
// bridge, nftables table, veth prefix, subnet and cgroup parent.
type daemon struct {
	names                         hostNames
	dir, stateDir, runDir, socket string
	cmd                           *exec.Cmd
	log                           *os.File
	// e2bURL and e2bKey are its E2B endpoint's (with e2b set).
	e2bURL, e2bKey string
	// metricsURL is its /metrics (behind e2bKey when that is set).
	metricsURL string
}

// binaries returns the forkbox and forkbox-agent binaries: bin/ of the
// repo when `make build` made them, else freshly built into dir.
func binaries(ctx context.Context, dir, binDir string) (string, string, error) {
	if binDir != "" {
		bin, agent := filepath.Join(binDir, "forkbox"), filepath.Join(binDir, "forkbox-agent")
		if !fileExists(bin) || !fileExists(agent) {
			return "", "", fmt.Errorf("--bin-dir %s: no forkbox and forkbox-agent there: %w", binDir, errdefs.ErrNotFound)
		}
		a, _ := filepath.Abs(bin)
		b, _ := filepath.Abs(agent)
		return a, b, nil
	}
	// A fresh build of this tree (fast from the build cache), never bin/:
	// a bin/ older than the tree measured the old code (a density run
	// stopped at a limit the tree had lifted).
	bin, agent := filepath.Join(dir, "forkbox"), filepath.Join(dir, "forkbox-agent")
	for out, pkg := range map[string]string{bin: "./cmd/forkbox", agent: "./cmd/forkbox-agent"} {
		cmd := exec.CommandContext(ctx, "go", "build", "-o", out, pkg)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if b, err := cmd.CombinedOutput(); err != nil {
			return "", "", fmt.Errorf("build %s (run from the repo root, or `make build`): %v\n%s", pkg, err, b)
		}
	}
	return bin, agent, nil
}

func fileExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular()
}

// startDaemon starts the throwaway daemon below dir and waits for its
// socket; with e2b, it also serves its E2B endpoint on a free loopback port.
// binDir, when set, names the forkbox and forkbox-agent build to run.
func startDaemon(ctx context.Context, dir, binDir, logLevel string, maxSandboxes int, e2b bool) (*daemon, error) {
	bin, agent, err := binaries(ctx, dir, binDir)
	if err != nil {
		return nil, err
	}
	names := namesFor(os.Getpid()).forAddresses(maxSandboxes)
	names.subnet = names.freeSubnet(network.HostRoutes())
	d := &daemon{names: names, dir: dir, stateDir: filepath.Join(dir, "state"), runDir: filepath.Join(dir, "run"),
		socket: filepath.Join(dir, "forkbox.sock")}
	if d.log, err = os.Create(filepath.Join(dir, "daemon.log")); err != nil {
		return nil, err
	}
	args := []string{"serve", "--state-dir", d.stateDir, "--run-dir", d.runDir, "--socket", d.socket,
		"--agent", agent, "--bridge", d.names.bridge, "--net-table", d.names.table, "--veth-prefix", d.names.veth,
		"--subnet", d.names.subnet, "--cgroup-parent", d.names.cgroup, "--max-sandboxes", strconv.Itoa(maxSandboxes),
		"--btrfs-size", benchBtrfsSize, "--log-level", logLevel}
	maddr, err := freeport.Loopback()
	if err != nil {
		return nil, err
	}
	d.metricsURL = "http://" + maddr + "/metrics"
	args = append(args, "--metrics", maddr)
	if e2b {
		addr, err := freeport.Loopback()
		if err != nil {
			return nil, err
		}
		key := make([]byte, 16)
		rand.Read(key)
		d.e2bURL, d.e2bKey = "http://"+addr, "bench_"+hex.EncodeToString(key)
		args = append(args, "--e2b", addr, "--api-token", d.e2bKey)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = d.log, d.log
	// Its own process group: a Ctrl-C in the terminal reaches the bench
	// only, which then closes the sandboxes and stops the daemon in order.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	d.cmd = cmd
	c := &client.Client{Socket: d.socket}
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if _, err := c.ListSandboxes(ctx, false); err == nil {
			return d, nil
		}
		if err := cmd.Process.Signal(syscall.Signal(0)); err != nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	return d, fmt.Errorf("daemon did not answer on %s:\n%s", d.socket, d.logTail(4096))
}

func (d *daemon) logTail(n int) string {
	b, _ := os.ReadFile(d.log.Name())
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// cleanup closes every sandbox of the daemon, stops it and removes what it
// left on the host: its btrfs loop device, bridge, nftables tables, netns
// mount and directory. It runs on a fresh context (ctx may be cancelled).
func (d *daemon) cleanup() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if d.cmd != nil {
		c := &client.Client{Socket: d.socket}
		list, _ := c.ListSandboxes(ctx, false)
		var sbs []*client.Sandbox
		for _, s := range list {
			if sb, err := c.Sandbox(ctx, s.Id); err == nil {
				sbs = append(sbs, sb)
			}
		}
		closeAll(ctx, sbs)
		d.cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { d.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			d.cmd.Process.Kill()
			<-done
		}
	}
	if err := btrfs.Detach(ctx, filepath.Join(d.stateDir, "snapshots")); err != nil {
		fmt.Fprintln(os.Stderr, "bench: detach btrfs:", err)
	}
	if m, err := network.New(ctx, network.Config{Bridge: d.names.bridge, Subnet: netip.MustParsePrefix(d.names.subnet), Table: d.names.table, VethPrefix: d.names.veth,
		NetnsDir: filepath.Join(d.runDir, "netns")}); err == nil {
		m.Destroy(ctx)
	}
	exec.Command("umount", "-l", filepath.Join(d.runDir, "netns")).Run()
	removeCgroupParent(d.names.cgroup)
	if d.log != nil {
		d.log.Close()
	}
}

// closeAll closes sandboxes a few at a time.
func closeAll(ctx context.Context, sbs []*client.Sandbox) {
	sem := make(chan struct{}, 6)
	var wg sync.WaitGroup
	for _, sb := range sbs {
		if sb == nil {
			continue
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			sb.Close(ctx)
		}()
	}
	wg.Wait()
}

// removeCgroupParent removes the daemon's (empty) parent cgroup from every
// hierarchy; rmdir of a cgroup that still has children or tasks fails and is
// left alone.
func removeCgroupParent(name string) {
	dirs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", name))
	for _, dir := range dirs {
		if err := syscall.Rmdir(dir); err != nil && !os.IsNotExist(err) {
			fmt.Fprintf(os.Stderr, "bench: remove cgroup %s: %v\n", dir, err)
		}
	}
}
