package e2e

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/errdefs"
)

const tokenStep = "head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n' > /root/token"

func envOpts(steps ...string) client.EnvironmentOptions {
	o := client.EnvironmentOptions{Image: env.image, Resources: client.Resources{CPU: "1", Memory: "256Mi"}}
	for _, s := range steps {
		o.Setup = append(o.Setup, client.Run(s))
	}
	return o
}

// waitEnv polls an environment until cond holds. The API has no watch for
// background work (pool refills, rebuilds), so this polls; the deadline is
// generous so that a loaded machine slows the test down rather than failing
// it.
func waitEnv(t *testing.T, e *client.Environment, what string, cond func(*client.EnvironmentInfo) bool) *client.EnvironmentInfo {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		info, _ := e.Info(ctx)
		if info != nil && cond(info) {
			return info
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s: not reached in 3 minutes: %+v", what, info)
		case <-tick.C:
		}
	}
}

func envSandbox(t *testing.T, e *client.Environment) *client.EnvSandbox {
	t.Helper()
	sb, err := e.Sandbox(context.Background(), client.Overrides{})
	if err != nil {
		t.Fatalf("env sandbox: %v", err)
	}
	t.Cleanup(func() { sb.Close(context.Background()) })
	return sb
}

func TestEnvironmentOneBuildForConcurrentCallers(t *testing.T) {
	ctx := context.Background()
	e := env.c.Environment("e2e-concurrent", envOpts(tokenStep, "sleep 1"))
	defer env.c.DeleteEnvironment(ctx, "e2e-concurrent")
	var wg sync.WaitGroup
	sbs := make([]*client.EnvSandbox, 3)
	errs := make([]error, 3)
	for i := range sbs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sbs[i], errs[i] = e.Sandbox(ctx, client.Overrides{})
		}()
	}
	wg.Wait()
	built, tokens := 0, map[string]bool{}
	for i, sb := range sbs {
		if errs[i] != nil {
			t.Fatalf("caller %d: %v", i, errs[i])
		}
		defer sb.Close(ctx)
		if sb.Built {
			built++
		}
		tokens[mustSh(t, sb.Sandbox, "cat /root/token")] = true
	}
	if built != 1 || len(tokens) != 1 {
		t.Errorf("3 concurrent callers: %d builds, %d distinct setups; want 1 and 1", built, len(tokens))
	}
	again := envSandbox(t, e)
	if again.Built {
		t.Errorf("a later call built again")
	}
}

func TestEnvironmentHashChangeAndPrefixReuse(t *testing.T) {
	ctx := context.Background()
	defer env.c.DeleteEnvironment(ctx, "e2e-prefix")
	first := envSandbox(t, env.c.Environment("e2e-prefix", envOpts(tokenStep)))
	tok1 := mustSh(t, first.Sandbox, "cat /root/token")
	info1, _ := env.c.GetEnvironment(ctx, "e2e-prefix")
	evs, err := env.c.Events(ctx, "env:e2e-prefix")
	if err != nil || !hasEvent(evs, "env.build_started") || !hasEvent(evs, "env.step") || !hasEvent(evs, "env.build_finished") {
		t.Errorf("environment ledger: %v, %v", types(evs), err)
	}

	// Appending a step: a new hash, built from the snapshot after step 1.
	second := envSandbox(t, env.c.Environment("e2e-prefix", envOpts(tokenStep, "echo two > /root/two")))
	if !second.Built {
		t.Errorf("a changed definition did not build")
	}
	if out := mustSh(t, second.Sandbox, "cat /root/token; echo; cat /root/two"); out != tok1+"\ntwo\n" {
		t.Errorf("after appending a step: %q; want step 1's output reused (%s) and step 2 run", out, tok1)
	}
	info2, _ := env.c.GetEnvironment(ctx, "e2e-prefix")
	if info2.CachedSteps != 1 || info2.Hash == info1.Hash || info2.Checkpoint == info1.Checkpoint {
		t.Errorf("prefix build: cached %d, hash %s -> %s, snapshot %s -> %s", info2.CachedSteps, info1.Hash, info2.Hash, info1.Checkpoint, info2.Checkpoint)
	}
	// Changing the first step: nothing to reuse, new output.
	third := envSandbox(t, env.c.Environment("e2e-prefix", envOpts(tokenStep+"; echo changed > /root/c", "echo two > /root/two")))
	if tok := mustSh(t, third.Sandbox, "cat /root/token"); tok == tok1 {
		t.Errorf("a changed first step reused the old snapshot")
	}
	// The first definition's snapshot is kept: going back needs no build.
	back := envSandbox(t, env.c.Environment("e2e-prefix", envOpts(tokenStep)))
	if back.Built || mustSh(t, back.Sandbox, "cat /root/token") != tok1 {
		t.Errorf("the old definition was rebuilt (built=%v)", back.Built)
	}
}

func TestEnvironmentFailedStepLeavesNothing(t *testing.T) {
	ctx := context.Background()
	defer env.c.DeleteEnvironment(ctx, "e2e-fail")
	before := countSandboxes(t)
	live, _ := env.c.ListSandboxes(ctx, false)
	_, err := env.c.Environment("e2e-fail", envOpts("echo good", "echo some-output; echo to-stderr >&2; exit 7")).Sandbox(ctx, client.Overrides{})
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "exited 7") || !strings.Contains(err.Error(), "some-output") {
		t.Fatalf("failed step: got %v; want FailedPrecondition with the exit code and output", err)
	}
	info, err := env.c.GetEnvironment(ctx, "e2e-fail")
	if err != nil || info.Checkpoint != "" || info.State != "failed" {
		t.Errorf("after a failed build: %+v, %v; want failed with no snapshot", info, err)
	}
	after, _ := env.c.ListSandboxes(ctx, false)
	if len(after) != len(live) {
		t.Errorf("a failed build left %d live sandboxes", len(after)-len(live))
	}
	all, _ := env.c.ListSandboxes(ctx, true)
	for _, s := range all[before:] {
		checkNoLeftovers(t, s.Id)
	}
}

func TestEnvironmentMaxAgeRebuildKeepsServing(t *testing.T) {
	ctx := context.Background()
	defer env.c.DeleteEnvironment(ctx, "e2e-age")
	o := envOpts(tokenStep)
	o.MaxAge = time.Second
	e := env.c.Environment("e2e-age", o)
	first := envSandbox(t, e)
	old := first.Info.FromCheckpoint
	tok := mustSh(t, first.Sandbox, "cat /root/token")
	// The snapshot must age past its max age (whole seconds in the API).
	// The daemon compares its built_at, kept in milliseconds, with the
	// host's clock, which this test shares: wait until that comparison is
	// certain to hold (a margin over the millisecond rounding), so the next
	// call cannot come too early however fast or slow the machine is.
	waitEnv(t, e, "snapshot older than its max age", func(i *client.EnvironmentInfo) bool {
		return i.Checkpoint == old && i.BuiltAtUnixMs > 0 &&
			time.Since(time.UnixMilli(i.BuiltAtUnixMs)) > o.MaxAge+100*time.Millisecond
	})
	// Too old: this call is still served from the old snapshot...
	served := envSandbox(t, e)
	if served.Info.FromCheckpoint != old || served.Built {
		t.Errorf("an old snapshot must keep serving while it is rebuilt: got %s (built %v), want %s", served.Info.FromCheckpoint, served.Built, old)
	}
	// ...and a rebuild runs in the background.
	info := waitEnv(t, e, "background rebuild", func(i *client.EnvironmentInfo) bool { return i.Checkpoint != old && i.State == "ready" })
	fresh := envSandbox(t, e)
	if fresh.Info.FromCheckpoint != info.Checkpoint || mustSh(t, fresh.Sandbox, "cat /root/token") == tok {
		t.Errorf("after the rebuild a sandbox still comes from the old snapshot")
	}
}

func TestEnvironmentPool(t *testing.T) {
	ctx := context.Background()
	defer env.c.DeleteEnvironment(ctx, "e2e-pool")
	o := envOpts("echo warm > /root/w")
	o.PoolSize = 2
	e := env.c.Environment("e2e-pool", o)
	if _, err := e.Build(ctx, nil); err != nil {
		t.Fatal(err)
	}
	waitPool := func(n int32) {
		t.Helper()
		waitEnv(t, e, fmt.Sprintf("pool of %d ready", n), func(i *client.EnvironmentInfo) bool { return i.PoolReady >= n })
	}
	waitPool(2)
	sb := envSandbox(t, e)
	if !sb.FromPool {
		t.Errorf("hand-over did not come from the pool")
	}
	if out := mustSh(t, sb.Sandbox, "cat /root/w"); out != "warm\n" {
		t.Errorf("pooled sandbox sees %q", out)
	}
	waitPool(2) // refilled in the background
	if err := env.c.DeleteEnvironment(ctx, "e2e-pool"); err != nil {
		t.Fatal(err)
	}
	live, _ := env.c.ListSandboxes(ctx, false)
	for _, s := range live {
		if strings.HasPrefix(s.Name, "pool-e2e-pool-") && s.Id != sb.ID {
			t.Errorf("pooled sandbox %s outlived its environment", s.Name)
		}
	}
	if out := mustSh(t, sb.Sandbox, "cat /root/w"); out != "warm\n" {
		t.Errorf("a handed-over sandbox must outlive its environment: %q", out)
	}
}
