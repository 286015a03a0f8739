package e2e

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/forkbox/forkbox/internal/runtime/runsc"
)

// checkCgroupLimits checks the host cgroup of a sandbox carries its CPU
// quota per 100 ms period and pids limit, on cgroup v1 or v2.
func checkCgroupLimits(t *testing.T, id string, quota int64, pids int64) {
	t.Helper()
	checkCPUQuota(t, id, quota)
	checkOtherLimits(t, id, pids)
}

// checkCPUQuota checks the host cgroup of a sandbox has its CPU limit:
// quota µs per 100 ms (a start that ran with a raised quota set it back).
func checkCPUQuota(t *testing.T, id string, quota int64) {
	t.Helper()
	rel := filepath.Join(cgroupParent, id)
	if _, err := os.Stat(filepath.Join("/sys/fs/cgroup/cpu", rel)); err == nil { // v1
		b, _ := os.ReadFile(filepath.Join("/sys/fs/cgroup/cpu", rel, "cpu.cfs_quota_us"))
		p, _ := os.ReadFile(filepath.Join("/sys/fs/cgroup/cpu", rel, "cpu.cfs_period_us"))
		if got := strings.TrimSpace(string(b)) + "/" + strings.TrimSpace(string(p)); got != strconv.FormatInt(quota, 10)+"/100000" {
			t.Errorf("sandbox %s: cpu.cfs_quota_us/cpu.cfs_period_us = %s, want %d/100000", id, got, quota)
		}
		return
	}
	b, _ := os.ReadFile(filepath.Join("/sys/fs/cgroup", rel, "cpu.max")) // v2
	if got := strings.TrimSpace(string(b)); got != strconv.FormatInt(quota, 10)+" 100000" {
		t.Errorf("sandbox %s: cpu.max = %q, want %d 100000", id, got, quota)
	}
}

// checkOtherLimits checks the host cgroup of a sandbox carries its pids
// limit and a memory limit.
func checkOtherLimits(t *testing.T, id string, pids int64) {
	t.Helper()
	read := func(p string) string {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Errorf("read %s: %v", p, err)
		}
		return strings.TrimSpace(string(b))
	}
	rel := filepath.Join(cgroupParent, id)
	if _, err := os.Stat(filepath.Join("/sys/fs/cgroup/cpu", rel)); err == nil { // v1
		// Under gVisor the host limit leaves room for the runtime's tasks.
		if got := read(filepath.Join("/sys/fs/cgroup/pids", rel, "pids.max")); got != strconv.FormatInt(pids, 10) && got != strconv.FormatInt(runsc.HostPidsLimit(pids), 10) {
			t.Errorf("pids.max = %s, want %d", got, pids)
		}
		if got := read(filepath.Join("/sys/fs/cgroup/memory", rel, "memory.limit_in_bytes")); got == "" || got == "9223372036854771712" {
			t.Errorf("memory.limit_in_bytes = %q, want a limit", got)
		}
		return
	}
	dir := filepath.Join("/sys/fs/cgroup", rel) // v2
	if got := read(filepath.Join(dir, "pids.max")); got != strconv.FormatInt(pids, 10) {
		t.Errorf("pids.max = %s, want %d", got, pids)
	}
	if got := read(filepath.Join(dir, "memory.max")); got == "max" {
		t.Errorf("memory.max = max, want a limit")
	}
}
