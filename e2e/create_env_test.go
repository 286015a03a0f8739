package e2e

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/forkbox/forkbox/client"
)

// TestCreateFromEnvironment: `forkbox create --environment` takes a warm
// pool sandbox first, forks the snapshot when overrides are given, carries
// the environment's disk limit, and says NotFound for an unknown name and
// FailedPrecondition for an environment that is not built.
func TestCreateFromEnvironment(t *testing.T) {
	forEachRuntime(t, func(t *testing.T) {
		ctx := context.Background()
		name := "e2e-create-" + curRuntime
		o := envOpts("echo built > /root/marker")
		o.Runtime, o.PoolSize, o.Resources.Disk = curRuntime, 1, "48Mi"
		e := env.c.Environment(name, o)
		if _, err := e.Build(ctx, nil); err != nil {
			t.Fatalf("build: %v", err)
		}
		defer env.c.DeleteEnvironment(ctx, name)
		waitEnv(t, e, "pool of 1 ready", func(i *client.EnvironmentInfo) bool { return i.PoolReady == 1 })

		out, errs, code := cli(t, "--json", "create", "--environment", name)
		var res struct {
			Sandbox  client.Info `json:"sandbox"`
			FromPool bool        `json:"from_pool"`
		}
		if code != 0 || json.Unmarshal([]byte(out), &res) != nil {
			t.Fatalf("create --environment: exit %d, %q %q", code, out, errs)
		}
		sb, err := env.c.Sandbox(ctx, res.Sandbox.Id)
		if err != nil {
			t.Fatal(err)
		}
		defer sb.Close(ctx)
		if !res.FromPool {
			t.Errorf("create --environment with a ready pool: from_pool false")
		}
		if got := mustSh(t, sb, "cat /root/marker"); got != "built\n" {
			t.Errorf("marker: got %q", got)
		}
		if got := sb.Info.GetResources().GetDisk(); got != "48Mi" {
			t.Errorf("disk of the environment's sandbox: got %q, want 48Mi", got)
		}
		if n, full := fill(t, sb, "/fill", 200); !full || n > 56 {
			t.Errorf("fill under the environment's 48Mi: got %d MiB, full=%v", n, full)
		}

		// With an override it forks the snapshot.
		out, errs, code = cli(t, "create", "--environment", name, "--name", name+"-named")
		if code != 0 || !strings.Contains(out, "forked from the snapshot") {
			t.Errorf("create --environment --name: exit %d, %q %q", code, out, errs)
		}
		if s, err := env.c.Sandbox(ctx, name+"-named"); err == nil {
			s.Close(ctx)
		}

		if _, errs, code := cli(t, "create", "--environment", "e2e-no-such-env"); code == 0 || !strings.Contains(errs, "(NotFound)") {
			t.Errorf("unknown environment: exit %d, %q, want NotFound", code, errs)
		}
		bad := env.c.Environment(name+"-broken", envOpts("exit 3"))
		if _, err := bad.Build(ctx, nil); err == nil {
			t.Fatalf("a failing setup built")
		}
		defer env.c.DeleteEnvironment(ctx, name+"-broken")
		if _, errs, code := cli(t, "create", "--environment", name+"-broken"); code == 0 || !strings.Contains(errs, "(FailedPrecondition)") {
			t.Errorf("environment not built: exit %d, %q, want FailedPrecondition", code, errs)
		}
	})
}
