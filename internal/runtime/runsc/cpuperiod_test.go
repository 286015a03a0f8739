package runsc

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/forkbox/forkbox/internal/cgroups"
	"github.com/forkbox/forkbox/internal/runtime/spec"
	"github.com/forkbox/forkbox/internal/runtime/testsuite"
)

// TestStartPeriodUnderLimitedParent: a sandbox whose CPU limit is
// accounted over spec.CPUStartPeriod (as the daemon starts gVisor
// sandboxes) runs under a parent cgroup limited to one CPU, and its
// cgroupfs shows the same share over 100 ms. On cgroup v1 the kernel
// refuses any write that puts a child above a limited parent's share: a
// runsc that writes the quota before the longer period (stock runsc) fails
// to make the cgroup (scripts/gvisor/cpu-period.patch).
func TestStartPeriodUnderLimitedParent(t *testing.T) {
	requireRunsc(t)
	parent := fmt.Sprintf("/forkbox-cpuparent-%d", os.Getpid())
	t.Cleanup(func() { cgroups.Remove(context.Background(), parent) }) // after the container's own cleanup
	dir := filepath.Join(cgroups.Root, "cpu", parent)
	if testsuite.CgroupV2() {
		dir = filepath.Join(cgroups.Root, parent)
		os.WriteFile(filepath.Join(cgroups.Root, "cgroup.subtree_control"), []byte("+cpu"), 0)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := cgroups.SetCPULimit(cgroups.Root, parent, 100000, 100000); err != nil {
		t.Fatalf("limit the parent to one CPU: %v", err)
	}
	tmp := t.TempDir()
	rt, err := New(Options{Root: filepath.Join(tmp, "state"), LogDir: filepath.Join(tmp, "logs")})
	if err != nil {
		t.Fatal(err)
	}
	f := testsuite.NewFixture(t, rt, spec.SpecOptions{Args: []string{"/bin/sh", "-c", "cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us /sys/fs/cgroup/cpu/cpu.cfs_period_us; sleep 1000"},
		CPU: 1, CPUPeriod: spec.CPUStartPeriod}, func(s *specs.Spec) { s.Linux.CgroupsPath = parent + "/sb" })
	if err := rt.Run(context.Background(), f.ID, f.Bundle); err != nil {
		t.Fatalf("run under a parent of one CPU: %v", err)
	}
	if q, p, err := cgroups.CPULimit(cgroups.Root, parent+"/sb"); err != nil || q != 1000000 || p != spec.CPUStartPeriod {
		t.Errorf("the sandbox's cgroup: %d/%d µs (%v), want 1000000/%d", q, p, err, spec.CPUStartPeriod)
	}
	if log := f.WaitLog(t, "\n100000\n", 30*time.Second); !strings.HasPrefix(log, "100000\n100000\n") {
		t.Errorf("the sandbox sees quota and period %q, want 100000 and 100000", log)
	}
}
