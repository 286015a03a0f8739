package main

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/network"
	"github.com/forkbox/forkbox/internal/snapshot/btrfs"
)

// The throwaway daemon's host names, distinct from the default daemon's and
// from the e2e suite's, and carrying a per-run suffix so that two benches
// on one host (two builds compared, or two developers) never share a bridge,
// nftables table, veth prefix, subnet or cgroup parent.
var (
	benchRunID        = fmt.Sprintf("%04x", os.Getpid()&0xffff)
	benchBridge       = "fbxb" + benchRunID
	benchNetTable     = "forkbox_bench_" + benchRunID
	benchVethPrefix   = "b" + benchRunID
	benchSubnet       = fmt.Sprintf("10.214.%d.0/22", 4*(os.Getpid()%64))
	benchCgroupParent = "forkbox-bench-" + benchRunID
)

const (
	benchMaxSandboxes = "150"
	benchBtrfsSize    = "32Gi"
)

// daemon is a throwaway `forkbox serve` with its own state, run dir, socket,
// bridge, nftables table, veth prefix, subnet and cgroup parent.
type daemon struct {
	dir, stateDir, runDir, socket string
	cmd                           *exec.Cmd
	log                           *os.File
}

// binaries returns the forkbox and forkbox-agent binaries: bin/ of the
// repo when `make build` made them, else freshly built into dir.
func binaries(ctx context.Context, dir, binDir string) (string, string, error) {
	bin, agent := "bin/forkbox", "bin/forkbox-agent"
	if binDir != "" {
		bin, agent = filepath.Join(binDir, "forkbox"), filepath.Join(binDir, "forkbox-agent")
		if !fileExists(bin) || !fileExists(agent) {
			return "", "", fmt.Errorf("--bin-dir %s: no forkbox and forkbox-agent there: %w", binDir, errdefs.ErrNotFound)
		}
	}
	if fileExists(bin) && fileExists(agent) {
		a, _ := filepath.Abs(bin)
		b, _ := filepath.Abs(agent)
		return a, b, nil
	}
	bin, agent = filepath.Join(dir, "forkbox"), filepath.Join(dir, "forkbox-agent")
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

// startDaemon starts the throwaway daemon below dir and waits for its socket.
func startDaemon(ctx context.Context, dir, binDir, logLevel string) (*daemon, error) {
	bin, agent, err := binaries(ctx, dir, binDir)
	if err != nil {
		return nil, err
	}
	d := &daemon{dir: dir, stateDir: filepath.Join(dir, "state"), runDir: filepath.Join(dir, "run"),
		socket: filepath.Join(dir, "forkbox.sock")}
	if d.log, err = os.Create(filepath.Join(dir, "daemon.log")); err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "serve", "--state-dir", d.stateDir, "--run-dir", d.runDir, "--socket", d.socket,
		"--agent", agent, "--bridge", benchBridge, "--net-table", benchNetTable, "--veth-prefix", benchVethPrefix,
		"--subnet", benchSubnet, "--cgroup-parent", benchCgroupParent, "--max-sandboxes", benchMaxSandboxes,
		"--btrfs-size", benchBtrfsSize, "--log-level", logLevel)
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
	if m, err := network.New(ctx, network.Config{Bridge: benchBridge, Subnet: netip.MustParsePrefix(benchSubnet), Table: benchNetTable, VethPrefix: benchVethPrefix,
		NetnsDir: filepath.Join(d.runDir, "netns")}); err == nil {
		m.Destroy(ctx)
	}
	exec.Command("umount", "-l", filepath.Join(d.runDir, "netns")).Run()
	removeCgroupParent(benchCgroupParent)
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
