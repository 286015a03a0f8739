package agent

import (
	"context"
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

// TestMemoryEnforcer: FORKBOX_MEMORY_ENFORCER=sentry turns the watchdog
// off (its run returns at once, a started process arms nothing) while the
// limit stays known for reporting the sentry's kills; anything but agent
// or sentry is refused.
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
		if got := s.memoryEnforcer(); got != want || s.cfg.MemoryLimit != 64<<20 {
			t.Errorf("%q: enforcer %s, limit %d; want %s, 67108864", v, got, s.cfg.MemoryLimit, want)
		}
		if watching := s.watch.limit > 0; watching != (want == "agent") {
			t.Errorf("%q: the watchdog's limit is %d", v, s.watch.limit)
		}
		if want == "sentry" {
			s.watch.run(context.Background()) // returns: nothing to watch
			s.watch.started(1)
			if len(s.watch.groups) != 0 {
				t.Errorf("%q: the watchdog registered a process group", v)
			}
		}
	}
	t.Setenv(EnvToken, testToken)
	t.Setenv(EnvMemoryEnforcer, "kernel")
	if _, err := ConfigFromEnv(); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("FORKBOX_MEMORY_ENFORCER=kernel: %v, want InvalidArgument", err)
	}
}
