package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"math"
	"time"

	"github.com/forkbox/forkbox/client"
)

// EnvResult is section 5: environments. A setup of about SetupS seconds of
// real work (a shell loop writing and hashing files in the sandbox), done
// fresh per run (a) against built once and forked per run (b), and the
// hand-over latency of a warm pool (c).
type EnvResult struct {
	Runtime string `json:"runtime"`
	// NominalSetupS is the setup time asked for (--env-setup); Iterations
	// is the loop count calibrated on this host to take about that long.
	NominalSetupS float64 `json:"nominal_setup_s"`
	Iterations    int     `json:"iterations"`
	Runs          int     `json:"runs"`
	// Setup is the measured setup exec of every fresh run of (a).
	Setup Summary `json:"setup"`
	// FreshRun is one run of (a): create + setup + task + close.
	FreshRun     Summary `json:"fresh_run"`
	FreshTotalMS float64 `json:"fresh_total_ms"`
	// BuildMS is the daemon's build time of (b) (Environment.BuildMs);
	// BuildCallMS is the first env.Sandbox call, which built it.
	BuildMS     float64 `json:"build_ms"`
	BuildCallMS float64 `json:"build_call_ms"`
	// ForkRun is one later run of (b): env.Sandbox + task + close.
	ForkRun     Summary `json:"fork_run"`
	ForkTotalMS float64 `json:"fork_total_ms"`
	ForkOverOne float64 `json:"fork_total_over_one_setup"`
	// ConcTotalMS is (b) again with the runs after the build started
	// concurrently, envParallel at a time, as an orchestrator fanning out
	// N runs would; ConcOverOne its ratio to one setup.
	ConcTotalMS   float64 `json:"concurrent_total_ms"`
	ConcOverOne   float64 `json:"concurrent_total_over_one_setup"`
	FreshOverFork float64 `json:"fresh_total_over_fork_total"`
	// Pool hand-overs (c): daemon-side HandoverMS and the client's call.
	PoolSize       int     `json:"pool_size"`
	HandoverDaemon Summary `json:"handover_daemon"`
	HandoverClient Summary `json:"handover_client"`
	SkippedNotPool int     `json:"skipped_not_from_pool"`
	RefillWait     Summary `json:"refill_wait"`
}

const envPoolSize = 3

// envSetupCmd is the setup: iterations of writing 32 KB of random bytes to
// a file and hashing it, after a nonce that keeps the daemon's step cache
// from serving an earlier build of the same command.
func envSetupCmd(nonce string, iterations int) string {
	return fmt.Sprintf(`set -e; rm -rf /envbench; mkdir -p /envbench; echo %s > /envbench/id; i=0; `+
		`while [ $i -lt %d ]; do head -c 32768 /dev/urandom > /envbench/f$i; sha256sum /envbench/f$i >> /envbench/sums; i=$((i+1)); done`,
		nonce, iterations)
}

// envTaskCmd is the tiny task: it checks that the setup's output is there.
func envTaskCmd(iterations int) string {
	return fmt.Sprintf(`[ "$(wc -l < /envbench/sums)" -eq %d ] && [ -s /envbench/id ]`, iterations)
}

func nonce() string {
	b := make([]byte, 4)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// calibrate returns the loop count whose setup exec takes about target on
// runtime rt. Every probe runs in a fresh sandbox, as the measured runs do
// (a warm sandbox runs the loop markedly faster): a short probe, one of a
// quarter of the target, then one of the full target, each sized from the
// one before; a last correction is applied without another probe.
func (b *bench) calibrate(ctx context.Context, rt string, target time.Duration) (int, error) {
	probe := func(k int) (float64, error) {
		sb, err := b.create(ctx, rt)
		if err != nil {
			return 0, err
		}
		defer b.close(ctx, sb)
		t := time.Now()
		if err := sh(ctx, sb, envSetupCmd(nonce(), k)); err != nil {
			return 0, fmt.Errorf("calibrate setup: %w", err)
		}
		return ms(time.Since(t)), nil
	}
	goal := ms(target)
	k, prevT := 30, 0.0
	for _, frac := range []float64{0, 0.25, 1} {
		if frac > 0 {
			// t scales with k; the exec's fixed cost is small beside it.
			k = max(int(math.Round(float64(k)*goal*frac/prevT)), 1)
		}
		t, err := probe(k)
		if err != nil {
			return 0, err
		}
		prevT = max(t, 1)
		progress("  calibration: %d iterations took %.2f s", k, t/1000)
	}
	k = max(int(math.Round(float64(k)*goal/prevT)), 1)
	progress("  calibration: %d iterations for %.1f s", k, target.Seconds())
	return k, nil
}

func (b *bench) measureEnv(ctx context.Context, rt string) (EnvResult, error) {
	o := b.opts
	r := EnvResult{Runtime: rt, NominalSetupS: o.envSetup.Seconds(), Runs: o.envRuns, PoolSize: envPoolSize}
	k, err := b.calibrate(ctx, rt, o.envSetup)
	if err != nil {
		return r, err
	}
	r.Iterations = k
	setup := envSetupCmd(nonce(), k)
	task := envTaskCmd(k)

	// (a) a fresh sandbox and the setup per run, one run at a time.
	progress("  (a) %d fresh runs: create + setup + task + close, sequential", o.envRuns)
	var setups, runs []float64
	t := time.Now()
	for range o.envRuns {
		t0 := time.Now()
		sb, err := b.create(ctx, rt)
		if err != nil {
			return r, err
		}
		t1 := time.Now()
		err = sh(ctx, sb, setup)
		setupMS := ms(time.Since(t1))
		if err == nil {
			err = sh(ctx, sb, task)
		}
		b.close(ctx, sb)
		if err != nil {
			return r, fmt.Errorf("fresh run: %w", err)
		}
		setups, runs = append(setups, setupMS), append(runs, ms(time.Since(t0)))
	}
	r.FreshTotalMS = ms(time.Since(t))
	r.Setup, r.FreshRun = summarize(setups), summarize(runs)
	progress("  (a) total %.1f s; setup p50 %.1f s", r.FreshTotalMS/1000, r.Setup.Median/1000)

	// (b) build once, then a fork per run.
	progress("  (b) build once, then %d env.Sandbox + task + close", o.envRuns)
	name := "bench-env-" + nonce()
	env := b.c.Environment(name, client.EnvironmentOptions{Image: b.image, Runtime: rt,
		Resources: client.Resources{Memory: o.memory}, Setup: []*client.SetupStep{client.Run(setup)}})
	defer b.deleteEnv(ctx, name)
	var forks []float64
	t = time.Now()
	for i := range o.envRuns {
		t0 := time.Now()
		es, err := env.Sandbox(ctx, client.Overrides{})
		if err != nil {
			return r, fmt.Errorf("environment sandbox: %w", err)
		}
		b.track(es.Sandbox)
		if i == 0 {
			r.BuildCallMS = ms(time.Since(t0))
			if !es.Built {
				b.close(ctx, es.Sandbox)
				return r, fmt.Errorf("environment %s: the first sandbox call did not build it", name)
			}
		}
		err = sh(ctx, es.Sandbox, task)
		b.close(ctx, es.Sandbox)
		if err != nil {
			return r, fmt.Errorf("environment run: %w", err)
		}
		if i > 0 {
			forks = append(forks, ms(time.Since(t0)))
		}
	}
	r.ForkTotalMS = ms(time.Since(t))
	r.ForkRun = summarize(forks)
	if info, err := env.Info(ctx); err == nil {
		r.BuildMS = info.BuildMs
		if info.CachedSteps != 0 {
			return r, fmt.Errorf("environment %s: build reused %d cached steps", name, info.CachedSteps)
		}
	}
	r.ForkOverOne = ratio(r.ForkTotalMS, r.Setup.Median)
	r.FreshOverFork = ratio(r.FreshTotalMS, r.ForkTotalMS)
	progress("  (b) total %.1f s (build %.1f s)", r.ForkTotalMS/1000, r.BuildMS/1000)
	b.deleteEnv(ctx, name)

	// (b2) the same, with the runs after the build fanned out.
	if err := b.measureEnvConcurrent(ctx, rt, setup, task, &r); err != nil {
		return r, err
	}

	return r, b.measurePool(ctx, rt, &r)
}

// measurePool is (c): hand-overs from a full warm pool, one at a time.
func (b *bench) measurePool(ctx context.Context, rt string, r *EnvResult) error {
	o := b.opts
	name := "bench-pool-" + nonce()
	env := b.c.Environment(name, client.EnvironmentOptions{Image: b.image, Runtime: rt, PoolSize: envPoolSize,
		Resources: client.Resources{Memory: o.memory}, Setup: []*client.SetupStep{client.Run(envSetupCmd(nonce(), 10))}})
	defer b.deleteEnv(ctx, name)
	progress("  (c) pool of %d: %d hand-overs, each from a full pool", envPoolSize, o.envSamples)
	if _, err := env.Build(ctx, nil); err != nil {
		return fmt.Errorf("build pool environment: %w", err)
	}
	var daemonMS, clientMS, waits []float64
	for attempts := 0; len(daemonMS) < o.envSamples; attempts++ {
		if attempts >= 2*o.envSamples {
			return fmt.Errorf("pool hand-over: only %d of %d samples came from the pool (%d not)", len(daemonMS), o.envSamples, r.SkippedNotPool)
		}
		w, err := b.waitPool(ctx, env, envPoolSize)
		if err != nil {
			return err
		}
		waits = append(waits, w)
		t := time.Now()
		es, err := env.Sandbox(ctx, client.Overrides{})
		d := ms(time.Since(t))
		if err != nil {
			return fmt.Errorf("pool hand-over: %w", err)
		}
		b.track(es.Sandbox)
		b.close(ctx, es.Sandbox)
		if !es.FromPool {
			r.SkippedNotPool++
			continue
		}
		daemonMS, clientMS = append(daemonMS, es.HandoverMS), append(clientMS, d)
	}
	r.HandoverDaemon, r.HandoverClient, r.RefillWait = summarize(daemonMS), summarize(clientMS), summarize(waits)
	return nil
}

// waitPool waits until the environment's pool holds n ready sandboxes and
// returns how long that took.
func (b *bench) waitPool(ctx context.Context, env *client.Environment, n int) (float64, error) {
	t := time.Now()
	deadline := t.Add(3 * time.Minute)
	for {
		info, err := env.Info(ctx)
		if err != nil {
			return 0, fmt.Errorf("environment info: %w", err)
		}
		if int(info.PoolReady) >= n {
			return ms(time.Since(t)), nil
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("pool of %s: %d of %d ready after 3 minutes (state %s %s)", info.Definition.GetName(), info.PoolReady, n, info.State, info.Error)
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// deleteEnv deletes an environment, also after an interrupt; deleting one
// already gone is fine.
func (b *bench) deleteEnv(ctx context.Context, name string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer cancel()
	if err := b.c.DeleteEnvironment(ctx, name); err != nil && ctx.Err() == nil {
		if _, gerr := b.c.GetEnvironment(ctx, name); gerr == nil {
			progress("delete environment %s: %v", name, err)
		}
	}
}

// envParallel is how many forked runs (b2) starts at once.
const envParallel = 4

// measureEnvConcurrent is (b2): build once (the first env.Sandbox call),
// then the other runs concurrently, envParallel at a time.
func (b *bench) measureEnvConcurrent(ctx context.Context, rt, setup, task string, r *EnvResult) error {
	o := b.opts
	progress("  (b2) build once, then %d runs %d at a time", o.envRuns-1, envParallel)
	name := "bench-envc-" + nonce()
	env := b.c.Environment(name, client.EnvironmentOptions{Image: b.image, Runtime: rt,
		Resources: client.Resources{Memory: o.memory}, Setup: []*client.SetupStep{client.Run(setup)}})
	defer b.deleteEnv(ctx, name)
	run := func() error {
		es, err := env.Sandbox(ctx, client.Overrides{})
		if err != nil {
			return fmt.Errorf("environment sandbox: %w", err)
		}
		b.track(es.Sandbox)
		err = sh(ctx, es.Sandbox, task)
		b.close(ctx, es.Sandbox)
		return err
	}
	t := time.Now()
	if err := run(); err != nil {
		return err
	}
	progress("  (b2) built and first run in %.1f s", ms(time.Since(t))/1000)
	sem := make(chan struct{}, envParallel)
	errs := make(chan error, o.envRuns)
	for range o.envRuns - 1 {
		sem <- struct{}{}
		go func() {
			defer func() { <-sem }()
			errs <- run()
		}()
	}
	for range envParallel {
		sem <- struct{}{}
	}
	close(errs)
	for err := range errs {
		if err != nil {
			return fmt.Errorf("environment run: %w", err)
		}
	}
	r.ConcTotalMS = ms(time.Since(t))
	r.ConcOverOne = ratio(r.ConcTotalMS, r.Setup.Median)
	progress("  (b2) total %.1f s", r.ConcTotalMS/1000)
	return nil
}
