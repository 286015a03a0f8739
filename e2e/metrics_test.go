package e2e

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/freeport"
)

// freeAddr returns a loopback address with a port nobody listens on, for
// the daemon to listen on (below the ephemeral range: see freeport).
func freeAddr(t *testing.T) string {
	t.Helper()
	a, err := freeport.Loopback()
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// scrape GETs url with the bearer token and returns each sample by its
// series as exposed (`name{a="x",b="y"}`).
func scrape(t *testing.T, url, token string) map[string]float64 {
	t.Helper()
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("GET %s: %d %s", url, resp.StatusCode, b)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("bad sample %q", line)
		}
		out[line[:i]] = v
	}
	return out
}

// TestMetrics checks that /metrics (on the TCP listener behind the token, and
// on --metrics) moves with a create, an exec, a fork, a checkpoint and an
// error, and shows the live sandboxes and their usage.
func TestMetrics(t *testing.T) {
	tcp, maddr := freeAddr(t), freeAddr(t)
	const token = "metrics-s3cret"
	withDaemonFlags(t, "--tcp", tcp, "--api-token", token, "--metrics", maddr)
	ctx := context.Background()

	for _, url := range []string{"http://" + tcp + "/metrics", "http://" + maddr + "/metrics"} {
		resp, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("GET %s without the token: got %d, want 401", url, resp.StatusCode)
		}
	}
	before := scrape(t, "http://"+tcp+"/metrics", token)

	// Over TCP, so that the calls go through the same listener as the scrape.
	c := &client.Client{URL: "http://" + tcp, Token: token}
	sb, err := c.CreateSandbox(ctx, client.CreateOptions{Image: env.image, Name: "metrics-src"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sb.Close(context.Background()) })
	var out strings.Builder
	if res, err := sb.Exec(ctx, client.ExecOptions{Shell: "echo hi", Stdout: &out}); err != nil || res.ExitCode != 0 {
		t.Fatalf("exec: %v %+v", err, res)
	}
	if _, err := sb.Checkpoint(ctx, "m1"); err != nil {
		t.Fatalf("checkpoint: %v", err)
	}
	fr, err := sb.Fork(ctx, client.ForkOptions{Tag: "m2", Count: 2})
	if err != nil {
		t.Fatalf("fork: %v", err)
	}
	for _, ch := range fr.Sandboxes() {
		t.Cleanup(func() { ch.Close(context.Background()) })
	}
	if len(fr.Sandboxes()) != 2 {
		t.Fatalf("fork: got %d children, want 2", len(fr.Sandboxes()))
	}
	if _, err := c.Sandbox(ctx, "metrics-no-such-sandbox"); !errdefs.IsNotFound(err) {
		t.Fatalf("get unknown: got %v, want NotFound", err)
	}

	after := scrape(t, "http://"+tcp+"/metrics", token)
	viaMetrics := scrape(t, "http://"+maddr+"/metrics", token)
	delta := func(series string) float64 { return after[series] - before[series] }
	for _, c := range []struct {
		series string
		min    float64
	}{
		{`forkbox_rpc_requests_total{procedure="SandboxService/CreateSandbox"}`, 1},
		{`forkbox_rpc_requests_total{procedure="SandboxService/Exec"}`, 1},
		{`forkbox_rpc_requests_total{procedure="SandboxService/Fork"}`, 1},
		{`forkbox_operation_duration_seconds_count{operation="create"}`, 1},
		{`forkbox_operation_duration_seconds_count{operation="exec"}`, 1},
		{`forkbox_operation_duration_seconds_count{operation="fork"}`, 1},
		{`forkbox_operation_duration_seconds_count{operation="checkpoint"}`, 1},
		{`forkbox_fork_children_count`, 1},
		{`forkbox_fork_children_sum`, 2},
		{`forkbox_fork_children_total{result="ok"}`, 2},
		{`forkbox_rpc_errors_total{class="NotFound",procedure="SandboxService/GetSandbox"}`, 1},
	} {
		if got := delta(c.series); got < c.min {
			t.Errorf("%s moved by %v, want at least %v", c.series, got, c.min)
		}
	}
	if got := after[`forkbox_sandboxes{state="running"}`]; got < 3 {
		t.Errorf(`forkbox_sandboxes{state="running"}: got %v, want at least 3 (the source and 2 children)`, got)
	}
	for _, id := range []string{sb.ID, fr.Sandboxes()[0].ID} {
		if _, ok := after[`forkbox_sandbox_memory_bytes{sandbox="`+id+`"}`]; !ok {
			t.Errorf("no forkbox_sandbox_memory_bytes series for live sandbox %s", id)
		}
		if _, ok := after[`forkbox_sandbox_cpu_seconds_total{sandbox="`+id+`"}`]; !ok {
			t.Errorf("no forkbox_sandbox_cpu_seconds_total series for live sandbox %s", id)
		}
	}
	if got := viaMetrics[`forkbox_rpc_requests_total{procedure="SandboxService/CreateSandbox"}`]; got < after[`forkbox_rpc_requests_total{procedure="SandboxService/CreateSandbox"}`] {
		t.Errorf("--metrics listener: CreateSandbox count %v, behind the TCP listener's", got)
	}

	// A closed sandbox's series go with it.
	if err := sb.Close(ctx); err != nil {
		t.Fatal(err)
	}
	final := scrape(t, "http://"+maddr+"/metrics", token)
	if _, ok := final[`forkbox_sandbox_memory_bytes{sandbox="`+sb.ID+`"}`]; ok {
		t.Errorf("closed sandbox %s still has a memory series", sb.ID)
	}
}
