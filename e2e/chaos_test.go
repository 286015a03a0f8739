package e2e

import (
	"context"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/internal/mount"
)

// Hostile host events: the daemon is SIGKILLed at a point inside an
// operation, restarted, and the whole run is audited (audit_test.go). The
// points are delays drawn from a seeded RNG after the operation is issued.
// The audit's invariants hold whatever point is hit, so the test cannot
// fail by timing: a different point only checks a different state.
//
//	FORKBOX_CHAOS_SEED=N     replay the points of seed N (printed by every run)
//	FORKBOX_CHAOS_POINTS=N   how many points (default 8, one per operation; 100 with FORKBOX_RELIABILITY=full)

const defaultChaosSeed = 20261130

// chaosOp is one operation to interrupt: prepare runs with the daemon up,
// before the kill window; run is what is interrupted; window bounds the
// random delay before the kill (about the operation's length here).
type chaosOp struct {
	name    string
	window  time.Duration
	prepare func(t *testing.T, rng *rand.Rand) any
	run     func(ctx context.Context, state any) error
}

// chaosSource creates a running sandbox holding a file, for an operation
// to act on.
func chaosSource(t *testing.T, runtime string) *client.Sandbox {
	t.Helper()
	o := clientOpts()
	o.Runtime = runtime
	sb, err := env.c.CreateSandbox(context.Background(), o)
	if err != nil {
		t.Fatalf("prepare: create: %v", err)
	}
	mustSh(t, sb, "echo chaos > /root/f")
	return sb
}

func pickRuntime(rng *rand.Rand) string { return runtimes[rng.Intn(len(runtimes))] }

var chaosOps = []chaosOp{
	{name: "create", window: 1500 * time.Millisecond,
		prepare: func(t *testing.T, rng *rand.Rand) any { return pickRuntime(rng) },
		run: func(ctx context.Context, s any) error {
			o := clientOpts()
			o.Runtime = s.(string)
			_, err := env.c.CreateSandbox(ctx, o)
			return err
		}},
	{name: "fork10", window: 5 * time.Second,
		prepare: func(t *testing.T, rng *rand.Rand) any { return chaosSource(t, pickRuntime(rng)) },
		run: func(ctx context.Context, s any) error {
			_, err := s.(*client.Sandbox).Fork(ctx, client.ForkOptions{Count: 10, Tag: "chaos"})
			return err
		}},
	{name: "checkpoint", window: 500 * time.Millisecond,
		prepare: func(t *testing.T, rng *rand.Rand) any { return chaosSource(t, pickRuntime(rng)) },
		run: func(ctx context.Context, s any) error {
			_, err := s.(*client.Sandbox).Checkpoint(ctx, "chaos")
			return err
		}},
	{name: "memory-checkpoint", window: 1500 * time.Millisecond,
		prepare: func(t *testing.T, rng *rand.Rand) any { return chaosSource(t, "gvisor") },
		run: func(ctx context.Context, s any) error {
			_, err := s.(*client.Sandbox).CheckpointMemory(ctx, "chaos-mem")
			return err
		}},
	{name: "hibernate", window: 1500 * time.Millisecond,
		prepare: func(t *testing.T, rng *rand.Rand) any { return chaosSource(t, "gvisor") },
		run:     func(ctx context.Context, s any) error { return s.(*client.Sandbox).Hibernate(ctx) }},
	{name: "wake", window: 1500 * time.Millisecond,
		prepare: func(t *testing.T, rng *rand.Rand) any {
			sb := chaosSource(t, "gvisor")
			if err := sb.Hibernate(context.Background()); err != nil {
				t.Fatalf("prepare: hibernate: %v", err)
			}
			return sb
		},
		run: func(ctx context.Context, s any) error { return s.(*client.Sandbox).Wake(ctx) }},
	{name: "env-build", window: 4 * time.Second,
		prepare: func(t *testing.T, rng *rand.Rand) any {
			name := fmt.Sprintf("chaos-%d", rng.Int63())
			t.Cleanup(func() { env.c.DeleteEnvironment(context.Background(), name) })
			return env.c.Environment(name, client.EnvironmentOptions{Image: env.image, Runtime: pickRuntime(rng),
				Resources: client.Resources{Memory: "256Mi"},
				Setup:     []*client.SetupStep{client.Run("echo one > /root/one"), client.Run("echo two > /root/two")}})
		},
		run: func(ctx context.Context, s any) error {
			_, err := s.(*client.Environment).Build(ctx, nil)
			return err
		}},
	{name: "delete", window: 800 * time.Millisecond,
		prepare: func(t *testing.T, rng *rand.Rand) any { return chaosSource(t, pickRuntime(rng)) },
		run:     func(ctx context.Context, s any) error { return s.(*client.Sandbox).Close(ctx) }},
}

func TestChaosDaemonKilled(t *testing.T) {
	seed := int64(envInt(t, "FORKBOX_CHAOS_SEED", defaultChaosSeed))
	points := envInt(t, "FORKBOX_CHAOS_POINTS", scaled(len(chaosOps), 100))
	t.Logf("chaos: %d kill points, seed %d (replay with FORKBOX_CHAOS_SEED=%d FORKBOX_CHAOS_POINTS=%d)", points, seed, seed, points)
	rng := rand.New(rand.NewSource(seed))
	closeAllLive(t)
	for i := 0; i < points; i++ {
		op := chaosOps[i%len(chaosOps)] // every operation in turn; the point within it is random
		delay := time.Duration(rng.Int63n(int64(op.window)))
		opRNG := rand.New(rand.NewSource(rng.Int63()))
		t.Run(fmt.Sprintf("%03d-%s-after-%dms", i, op.name, delay.Milliseconds()), func(t *testing.T) {
			ctx := context.Background()
			state := op.prepare(t, opRNG)
			done := make(chan error, 1)
			go func() { done <- op.run(ctx, state) }()
			var opErr error
			select {
			case opErr = <-done: // finished before the kill point
				t.Logf("%s finished before the kill (%v)", op.name, opErr)
				stopDaemon(syscall.SIGKILL)
			case <-time.After(delay):
				stopDaemon(syscall.SIGKILL)
				opErr = <-done
				t.Logf("killed during %s after %s; the caller got: %v", op.name, delay, opErr)
			}
			restartAfterKill(t)
			audit(t)
			closeAllLive(t)
		})
	}
}

// restartAfterKill starts the killed daemon again. A daemon that cannot
// start is a failure of the point; the host is then repaired by hand (what
// is left of this run's sandboxes is unmounted), so that the rest of the
// suite can run, and the daemon started again.
func restartAfterKill(t *testing.T) {
	t.Helper()
	err := startDaemon()
	if err == nil {
		return
	}
	// startDaemon gives up after 60 s; a loaded host can need more. A
	// daemon that is still alive is working (reconcile): wait for it as
	// long as it lives, within a generous bound.
	if err = waitDaemonAlive(10 * time.Minute); err == nil {
		t.Logf("the daemon took more than startDaemon's 60 s to answer after the kill (a loaded host)")
		return
	}
	log, _ := os.ReadFile(env.logFile.Name())
	var mounts []string
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	for _, l := range strings.Split(string(mi), "\n") {
		if strings.Contains(l, filepath.Join(env.stateDir, "sandboxes")) {
			mounts = append(mounts, l)
		}
	}
	t.Errorf("the daemon does not start after the kill: %v\n---- daemon log (end) ----\n%s\n---- mounts under the bundles ----\n%s",
		err, tail(log, 1500), strings.Join(mounts, "\n"))
	stopDaemon(syscall.SIGKILL)
	for i := 0; i < 8; i++ { // stacked mounts come off one at a time
		mps, _ := mount.Under(filepath.Join(env.stateDir, "sandboxes"))
		if len(mps) == 0 {
			break
		}
		for _, mp := range mps {
			mount.Unmount(context.Background(), mp)
		}
	}
	if err := startDaemon(); err != nil {
		t.Fatalf("the daemon does not start even after the repair: %v", err)
	}
}

// waitDaemonAlive waits until the daemon env.daemon answers, or exits, or
// limit passes.
func waitDaemonAlive(limit time.Duration) error {
	if env.daemon == nil {
		return fmt.Errorf("no daemon process")
	}
	pid := env.daemon.Process.Pid
	c := &client.Client{Socket: env.socket}
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		if _, err := c.ListSandboxes(context.Background(), false); err == nil {
			return nil
		}
		if f := procStat(strconv.Itoa(pid)); len(f) < 1 || f[0] == "Z" {
			return fmt.Errorf("the daemon (pid %d) exited", pid)
		}
		time.Sleep(200 * time.Millisecond) // a poll of the socket, not a synchronisation
	}
	return fmt.Errorf("the daemon (pid %d) is alive but did not answer within %s", pid, limit)
}
