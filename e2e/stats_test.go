package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/forkbox/forkbox/client"
)

// cli runs the forkbox CLI against this run's daemon and returns its
// stdout and stderr, and its exit code.
func cli(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(env.bin, append([]string{"--host", "unix://" + env.socket}, args...)...)
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("forkbox %v: %v", args, err)
	}
	return out.String(), errb.String(), code
}

// waitMetrics reads sb's metrics until cond holds; the counters move on
// their own clock (btrfs commits its quota accounting within 30 s), so the
// deadline is generous.
func waitMetrics(t *testing.T, sb *client.Sandbox, what string, cond func(*client.Metrics) bool) *client.Metrics {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		m, err := sb.Metrics(ctx)
		if err == nil && cond(m) {
			return m
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s: not seen in 2 minutes: last %+v, %v", what, m, err)
		case <-tick.C:
		}
	}
}

// TestSandboxMetrics: every counter reads, and moves when the sandbox
// burns CPU, allocates memory, writes to disk and sends packets.
func TestSandboxMetrics(t *testing.T) {
	forEachRuntime(t, func(t *testing.T) {
		ctx := context.Background()
		o := clientOpts()
		o.Resources.Disk = "256Mi"
		sb := newSandbox(t, o)
		m0, err := sb.Metrics(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(m0.Unavailable) != 0 {
			t.Errorf("unavailable counters: %v", m0.Unavailable)
		}
		if m0.SandboxId != sb.ID || m0.Runtime != curRuntime || m0.CpuLimit != 1 || m0.DiskLimitBytes != 256<<20 ||
			m0.MemoryLimitBytes <= 0 || m0.PidsLimit <= 0 || m0.Pids < 1 || m0.MemoryBytes <= 0 {
			t.Errorf("first reading: %+v", m0)
		}

		// CPU: a busy loop in the background.
		if _, err := sb.Start(ctx, client.ExecOptions{Shell: "i=0; while [ $i -lt 2000000 ]; do i=$((i+1)); done"}); err != nil {
			t.Fatal(err)
		}
		waitMetrics(t, sb, "CPU time +0.5s", func(m *client.Metrics) bool { return m.CpuSeconds > m0.CpuSeconds+0.5 })

		// Memory: a process that holds 64 MiB.
		if _, err := sb.Start(ctx, client.ExecOptions{Shell: "x=$(head -c 67108864 /dev/zero | tr '\\0' a); sleep 600"}); err != nil {
			t.Fatal(err)
		}
		waitMetrics(t, sb, "memory +48MiB", func(m *client.Metrics) bool { return m.MemoryBytes > m0.MemoryBytes+48<<20 })

		// Disk: 32 MiB written (the quota accounting moves at a btrfs commit).
		mustSh(t, sb, "dd if=/dev/zero of=/fill bs=1M count=32 conv=fsync 2>/dev/null; sync")
		waitMetrics(t, sb, "disk +24MiB", func(m *client.Metrics) bool { return m.DiskBytes > m0.DiskBytes+24<<20 })

		// Network: connection attempts to the gateway (ARP and SYNs out,
		// ARP replies in; the egress policy drops nothing at the veth).
		if _, err := sb.Start(ctx, client.ExecOptions{Shell: fmt.Sprintf("for i in $(seq 1 120); do wget -q -T 1 -O /dev/null http://%s:9/ ; done", gateway)}); err != nil {
			t.Fatal(err)
		}
		waitMetrics(t, sb, "network rx and tx", func(m *client.Metrics) bool {
			return m.NetTxBytes > m0.NetTxBytes && m.NetRxBytes > m0.NetRxBytes
		})

		// The CLI: one table, and JSON.
		out, errs, code := cli(t, "stats", "--no-stream", sb.ID)
		if code != 0 || !strings.Contains(out, sb.ID) || !strings.Contains(out, "MEM USAGE / LIMIT") {
			t.Errorf("stats --no-stream: exit %d, %q %q", code, out, errs)
		}
		out, errs, code = cli(t, "stats", "--json")
		var list []map[string]any
		if code != 0 || json.Unmarshal([]byte(out), &list) != nil {
			t.Fatalf("stats --json: exit %d, %q %q", code, out, errs)
		}
		found := false
		for _, m := range list {
			found = found || m["sandbox_id"] == sb.ID
		}
		if !found {
			t.Errorf("stats --json: %s missing from %s", sb.ID, out)
		}
		// A closed sandbox has no metrics.
		sb.Close(ctx)
		if _, err := sb.Metrics(ctx); err == nil {
			t.Errorf("metrics of a closed sandbox: got no error")
		}
	})
}

// TestStatsStream: `forkbox stats` refreshes, shows a CPU rate from the
// second reading on, and stops on Ctrl-C with exit 0.
func TestStatsStream(t *testing.T) {
	forEachRuntime(t, func(t *testing.T) {
		ctx := context.Background()
		sb := newSandbox(t, clientOpts())
		if _, err := sb.Start(ctx, client.ExecOptions{Shell: "while :; do :; done"}); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(env.bin, "--host", "unix://"+env.socket, "stats", "--interval", "300ms", sb.ID)
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		timer := time.AfterFunc(2*time.Minute, func() { cmd.Process.Kill() })
		defer timer.Stop()
		sc := bufio.NewScanner(stdout)
		tables, rate := 0, ""
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) > 0 && f[0] == "SANDBOX" {
				tables++
			}
			// The busy loop's share of the host depends on the host's load
			// (it was 3.9% of a core under a load of 600): any CPU used
			// between two readings shows it is a rate, so the first
			// table with a rate above zero ends the wait.
			if len(f) > 3 && f[0] == sb.ID && strings.HasSuffix(f[3], "%") {
				rate = f[3]
				v, err := strconv.ParseFloat(strings.TrimSuffix(rate, "%"), 64)
				if err != nil || v < 0 || v > 200 {
					t.Fatalf("CPU %% of a busy loop limited to one core: got %s", rate)
				}
				if v > 0 {
					break
				}
			}
		}
		if rate == "" || rate == "0.0%" {
			t.Fatalf("no CPU rate above zero after %d tables (last %q): %v", tables, rate, sc.Err())
		}
		cmd.Process.Signal(os.Interrupt)
		go io.Copy(io.Discard, stdout)
		if err := cmd.Wait(); err != nil {
			t.Errorf("stats after Ctrl-C: %v, want exit 0", err)
		}
		if tables < 2 {
			t.Errorf("tables before the rate: %d, want at least 2 (the first has no rate)", tables)
		}
	})
}

// TestCLIRmGoesOn: forkbox rm of several sandboxes closes every one it
// can, reports each that it cannot, and fails: before, it stopped at the
// first failure and left the rest running.
func TestCLIRmGoesOn(t *testing.T) {
	ctx := context.Background()
	a, b := newSandbox(t, clientOpts()), newSandbox(t, clientOpts())
	out, stderr, code := cli(t, "rm", a.ID, "sb-000000000000", b.ID, "sb-000000000001")
	if code == 0 {
		t.Errorf("rm with unknown sandboxes: exit 0")
	}
	if out != a.ID+"\n"+b.ID+"\n" {
		t.Errorf("rm printed %q, want both closed sandboxes", out)
	}
	for _, id := range []string{"sb-000000000000", "sb-000000000001"} {
		if !strings.Contains(stderr, id) || !strings.Contains(stderr, "(NotFound)") {
			t.Errorf("rm's errors %q do not report %s", stderr, id)
		}
	}
	for _, sb := range []*client.Sandbox{a, b} {
		if err := sb.Refresh(ctx); err != nil || sb.Info.State != "closed" {
			t.Errorf("%s after rm: %q (%v)", sb.ID, sb.Info.State, err)
		}
	}
}
