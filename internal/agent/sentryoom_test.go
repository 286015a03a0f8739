package agent

import "testing"

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
