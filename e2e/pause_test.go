package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/errdefs"
)

// cpuUsage returns the CPU time the sandbox's cgroup has used (v1 cpuacct
// or v2 cpu.stat).
func cpuUsage(t *testing.T, id string) time.Duration {
	t.Helper()
	if b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/cpuacct", cgroupParent, id, "cpuacct.usage")); err == nil {
		ns, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		return time.Duration(ns)
	}
	b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup", cgroupParent, id, "cpu.stat"))
	if err != nil {
		t.Fatalf("no cpu accounting for %s: %v", id, err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "usage_usec "); ok {
			us, _ := strconv.ParseInt(v, 10, 64)
			return time.Duration(us) * time.Microsecond
		}
	}
	t.Fatalf("no usage_usec in cpu.stat")
	return 0
}

func TestPauseUsesNoCPU(t *testing.T) {
	forEachRuntime(t, func(t *testing.T) {
		ctx := context.Background()
		sb := newSandbox(t, clientOpts())
		if _, err := sb.Start(ctx, client.ExecOptions{Shell: "while :; do :; done"}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(300 * time.Millisecond)
		busy0 := cpuUsage(t, sb.ID)
		time.Sleep(500 * time.Millisecond)
		busy := cpuUsage(t, sb.ID) - busy0
		if busy < 100*time.Millisecond {
			t.Fatalf("the busy loop used only %s of CPU in 500 ms: the measurement proves nothing", busy)
		}
		if err := sb.Pause(ctx); err != nil {
			t.Fatal(err)
		}
		p0 := cpuUsage(t, sb.ID)
		time.Sleep(time.Second)
		if used := cpuUsage(t, sb.ID) - p0; used > 20*time.Millisecond {
			t.Errorf("paused for 1 s, the sandbox used %s of CPU (running: %s per 500 ms)", used, busy)
		}
		if _, err := sb.Exec(ctx, client.ExecOptions{Shell: "true"}); !errdefs.IsFailedPrecondition(err) {
			t.Errorf("exec while paused: got %v", err)
		}
		// The SDK can resume it for the exec when asked to.
		if res, err := sb.Exec(ctx, client.ExecOptions{Shell: "true", AutoResume: true}); err != nil || res.ExitCode != 0 {
			t.Fatalf("exec with AutoResume on a paused sandbox: %+v, %v", res, err)
		}
		if err := sb.Refresh(ctx); err != nil || sb.Info.State != "running" {
			t.Errorf("after an auto-resumed exec: state %q, %v", sb.Info.GetState(), err)
		}
		u0 := cpuUsage(t, sb.ID)
		time.Sleep(500 * time.Millisecond)
		if used := cpuUsage(t, sb.ID) - u0; used < 100*time.Millisecond {
			t.Errorf("after unpause the busy loop used only %s in 500 ms: not running again", used)
		}
	})
}
