package daemon

import (
	"bytes"
	"log/slog"
	"os"
	"strings"
	"testing"

	"github.com/forkbox/forkbox/internal/cgroups"
	"github.com/forkbox/forkbox/internal/runtime/testsuite"
)

func TestHostPidsWarning(t *testing.T) {
	// The bench's density run on this host: pid_max 32768 failed at 864.
	if w := hostPidsWarning(32768, 192726, 1000); !strings.Contains(w, "kernel.pid_max is 32768") || strings.Contains(w, "threads-max is") ||
		!strings.Contains(w, "sysctl -w kernel.pid_max=4194304") {
		t.Errorf("pid_max 32768, 1000 sandboxes: %q", w)
	}
	if w := hostPidsWarning(32768, 192726, 100); w != "" {
		t.Errorf("pid_max 32768 holds 100 sandboxes, got %q", w)
	}
	if w := hostPidsWarning(4194304, 10000, 1000); !strings.Contains(w, "kernel.threads-max is 10000") || strings.Contains(w, "pid_max is") {
		t.Errorf("threads-max 10000: %q", w)
	}
	if w := hostPidsWarning(0, 0, 1000); w != "" { // unreadable: no claim
		t.Errorf("unknown limits: %q", w)
	}
}

// TestFavorDynModsAtStart: what serve --cgroup-favordynmods does at start
// switches the option on (or finds it on) and says so.
func TestFavorDynModsAtStart(t *testing.T) {
	testsuite.Need(t, os.Geteuid() == 0, "favordynmods needs root")
	var buf bytes.Buffer
	favorDynMods(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})))
	out := buf.String()
	if !strings.Contains(out, "switched cgroup favordynmods on") && !strings.Contains(out, "cgroup favordynmods already on") {
		t.Fatalf("log: %s", out)
	}
	if mp, changed, err := cgroups.FavorDynMods(); err != nil || changed {
		t.Errorf("%s after favorDynMods: changed %v, %v; want favordynmods on already", mp, changed, err)
	}
}
