package agent

import (
	"errors"
	"io"
	"log/slog"
	"os"
	"testing"

	"github.com/forkbox/forkbox/errdefs"
)

// The kernel log of a sentry built with scripts/gvisor/memory-limit.patch
// names each OOM kill by pid; only the exact pid matches.
func TestSentryKilled(t *testing.T) {
	log := []byte("<6>[   0.000000] Starting gVisor...\n" +
		"<3>[  12.345678] Memory cgroup out of memory: Killed process 42 (dd) anon-rss:2048kB, charged:65536kB, limit:65536kB, request:131072kB\n")
	for pid, want := range map[int]bool{42: true, 4: false, 421: false, 2: false} {
		if got := sentryKilled(log, pid); got != want {
			t.Errorf("sentryKilled(pid %d) = %v, want %v", pid, got, want)
		}
	}
	if sentryKilled([]byte("Killed process 42 (dd)"), 42) {
		t.Error("a line without the OOM killer's words matched")
	}
}

// TestMemoryEnforcer: FORKBOX_MEMORY_ENFORCER=sentry slows the watchdog
// to sentryWatchInterval while the limit stays its and known for reporting
// the sentry's kills; anything but agent or sentry is refused.
func TestMemoryEnforcer(t *testing.T) {
	for v, want := range map[string]string{"": "agent", "agent": "agent", "sentry": "sentry"} {
		t.Setenv(EnvToken, testToken)
		t.Setenv(EnvMemoryLimit, "67108864")
		t.Setenv(EnvMemoryEnforcer, v)
		cfg, err := ConfigFromEnv()
		if err != nil {
			t.Fatalf("%q: %v", v, err)
		}
		if _, set := os.LookupEnv(EnvMemoryEnforcer); set {
			t.Errorf("%q: %s is left in the environment", v, EnvMemoryEnforcer)
		}
		cfg.LogDir, cfg.Logger = t.TempDir(), slog.New(slog.NewTextHandler(io.Discard, nil))
		s, err := NewServer(cfg)
		if err != nil {
			t.Fatal(err)
		}
		interval := watchInterval
		if want == "sentry" {
			interval = sentryWatchInterval
		}
		if got := s.memoryEnforcer(); got != want || s.watch.limit != 64<<20 || s.watch.interval != interval {
			t.Errorf("%q: enforcer %s, watchdog limit %d every %v; want %s, 67108864 every %v", v, got, s.watch.limit, s.watch.interval, want, interval)
		}
	}
	t.Setenv(EnvToken, testToken)
	t.Setenv(EnvMemoryEnforcer, "kernel")
	if _, err := ConfigFromEnv(); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("FORKBOX_MEMORY_ENFORCER=kernel: %v, want InvalidArgument", err)
	}
}

// TestWatchdogBackstopBesideSentry: beside a sentry that enforces the limit,
// the watchdog still kills what passes it (here the host's own dd; under
// gVisor, shared memory the sentry does not refuse).
func TestWatchdogBackstopBesideSentry(t *testing.T) {
	if _, err := os.Stat("/bin/dd"); err != nil {
		t.Skip("needs /bin/dd")
	}
	_, c := startServerWith(t, Config{MemoryLimit: 64 << 20, SentryEnforcesMemory: true})
	res, err := c.Exec(testCtx(t), ExecRequest{Argv: []string{"dd", "if=/dev/zero", "of=" + stuckFifo(t), "bs=300M", "count=1"}}, nil, nil)
	if err != nil || !res.OOMKilled {
		t.Fatalf("dd of 300M beside the sentry: got %+v, %v; want OOM-killed", res, err)
	}
}
