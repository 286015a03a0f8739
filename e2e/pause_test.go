package e2e

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/cgroups"
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

// waitCPU waits until the sandbox's cgroup has used at least want of CPU
// since from, bounded by a generous deadline: a busy loop on a loaded host
// gets its CPU later, not never.
func waitCPU(t *testing.T, id string, from, want time.Duration, what string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	for {
		used := cpuUsage(t, id) - from
		if used >= want {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s: the cgroup used only %s of CPU in 3 minutes, want %s", what, used, want)
		case <-time.After(10 * time.Millisecond): // poll interval
		}
	}
}

// TestPauseUsesNoCPU: a paused sandbox's busy loop uses no CPU at all, and
// runs again once resumed. Nothing here depends on how much CPU the host
// gives the loop: that it was busy before the pause and after the resume is
// waited for (its cgroup's CPU counter advancing), and while it is stopped
// the median of its usage over a few windows is compared with an absolute
// bound, which a stopped sandbox meets however loaded the host is.
func TestPauseUsesNoCPU(t *testing.T) {
	forEachRuntime(t, func(t *testing.T) {
		ctx := context.Background()
		sb := newSandbox(t, clientOpts())
		if _, err := sb.Start(ctx, client.ExecOptions{Shell: "while :; do :; done"}); err != nil {
			t.Fatal(err)
		}
		waitCPU(t, sb.ID, cpuUsage(t, sb.ID), 200*time.Millisecond, "the busy loop runs before the pause")
		if err := sb.Pause(ctx); err != nil {
			t.Fatal(err)
		}
		// Pause returns once the sandbox is stopped in place (gVisor: every
		// task stopped inside the sentry; crun: the cgroup frozen); check it
		// here too, so the window below starts with every task stopped.
		if !stoppedInPlace(t, sb.ID) {
			t.Fatalf("after Pause the sandbox %s is not stopped in place", sb.ID)
		}
		// The measurement: five windows of 400 ms, and the median of
		// their CPU must be under 5 ms. A stopped sandbox's counter does not
		// move, beyond the gVisor sentry's own runtime (its Go timers, and
		// now and then a garbage collection or scavenge of a few ms, which
		// a loaded CI host once stretched to 21 ms in one second); such a
		// burst lands in one window, not in three. A loop still running
		// moves the counter in every window it gets a CPU in.
		windows := make([]time.Duration, 5)
		prev := cpuUsage(t, sb.ID)
		for i := range windows {
			time.Sleep(400 * time.Millisecond) // measurement window, not synchronisation
			cur := cpuUsage(t, sb.ID)
			windows[i], prev = cur-prev, cur
		}
		if !stoppedInPlace(t, sb.ID) {
			t.Fatalf("the sandbox %s ran again during the measurement", sb.ID)
		}
		if med := median(windows); med > 5*time.Millisecond {
			t.Errorf("paused, the sandbox used a median %s of CPU per 400 ms (windows %v); a stopped sandbox uses none", med, windows)
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
		// Running again: its CPU counter advances (a loop still frozen fails
		// here at the deadline).
		waitCPU(t, sb.ID, cpuUsage(t, sb.ID), 200*time.Millisecond, "the busy loop runs again after the resume")
	})
}

// median returns the middle of ds (sorted in place).
func median(ds []time.Duration) time.Duration {
	slices.Sort(ds)
	return ds[len(ds)/2]
}

// stoppedInPlace reports whether a sandbox's processes are stopped the way
// its runtime stops them: gVisor inside its sentry (runsc reports the
// container paused; its host cgroup is never frozen, see
// internal/daemon/suspend.go), crun by the cgroup freezer.
func stoppedInPlace(t *testing.T, id string) bool {
	t.Helper()
	cg := "/" + cgroupParent + "/" + id
	frozen, err := cgroups.Frozen(cg)
	if err != nil {
		t.Fatalf("freezer of %s: %v", cg, err)
	}
	if curRuntime != "gvisor" {
		return frozen
	}
	if frozen {
		t.Errorf("the gVisor sandbox %s has a frozen host cgroup", id)
	}
	out, err := exec.Command("runsc", "--root", runscRoot(id), "state", id).Output()
	if err != nil {
		t.Fatalf("runsc state %s: %v", id, err)
	}
	var st struct{ Status string }
	if err := json.Unmarshal(out, &st); err != nil {
		t.Fatalf("runsc state %s: %v in %q", id, err, out)
	}
	return st.Status == "paused"
}
