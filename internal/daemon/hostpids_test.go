package daemon

import (
	"strings"
	"testing"
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
