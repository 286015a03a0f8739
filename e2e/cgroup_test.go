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
	read := func(p string) string {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Errorf("read %s: %v", p, err)
		}
		return strings.TrimSpace(string(b))
	}
	rel := filepath.Join(cgroupParent, id)
	if _, err := os.Stat(filepath.Join("/sys/fs/cgroup/cpu", rel)); err == nil { // v1
		if got := read(filepath.Join("/sys/fs/cgroup/cpu", rel, "cpu.cfs_quota_us")); got != strconv.FormatInt(quota, 10) {
			t.Errorf("cpu.cfs_quota_us = %s, want %d", got, quota)
		}
		if got := read(filepath.Join("/sys/fs/cgroup/cpu", rel, "cpu.cfs_period_us")); got != "100000" {
			t.Errorf("cpu.cfs_period_us = %s, want 100000", got)
		}
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
	if got := read(filepath.Join(dir, "cpu.max")); got != strconv.FormatInt(quota, 10)+" 100000" {
		t.Errorf("cpu.max = %s, want %d 100000", got, quota)
	}
	if got := read(filepath.Join(dir, "pids.max")); got != strconv.FormatInt(pids, 10) {
		t.Errorf("pids.max = %s, want %d", got, pids)
	}
	if got := read(filepath.Join(dir, "memory.max")); got == "max" {
		t.Errorf("memory.max = max, want a limit")
	}
}
