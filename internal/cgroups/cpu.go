package cgroups

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/forkbox/forkbox/errdefs"
)

// A sandbox's CPU limit (CFS bandwidth): quota µs of CPU time per period
// µs. The OCI runtime sets it when it makes the cgroup; the daemon changes
// the period it is accounted over once a sandbox is up (spec.CPUStartPeriod).

// cpuV1Dirs are the v1 cpu controller's hierarchies, alone or co-mounted.
var cpuV1Dirs = []string{"cpu", "cpu,cpuacct"}

// SetCPULimit sets the cgroup's CPU limit to quota µs per period µs: v1
// cpu.cfs_quota_us and cpu.cfs_period_us, else v2 cpu.max. On v1 the two
// files are written one at a time, in the order that keeps the limit in
// between the lower of the two (the kernel refuses a child whose share
// exceeds a limited parent's).
func SetCPULimit(root, path string, quota int64, period uint64) error {
	if quota <= 0 || period == 0 {
		return fmt.Errorf("cgroup %s: cpu limit %d/%d µs: %w", path, quota, period, errdefs.ErrInvalidArgument)
	}
	for _, ctl := range cpuV1Dirs {
		dir := filepath.Join(root, ctl, path)
		cur, ok := readInt(filepath.Join(dir, "cpu.cfs_period_us"))
		if !ok {
			continue
		}
		q := []string{"cpu.cfs_quota_us", strconv.FormatInt(quota, 10)}
		p := []string{"cpu.cfs_period_us", strconv.FormatUint(period, 10)}
		order := [][]string{p, q} // a longer period first: a lower share in between
		if period < uint64(cur) {
			order = [][]string{q, p}
		}
		for _, w := range order {
			if err := os.WriteFile(filepath.Join(dir, w[0]), []byte(w[1]), 0); err != nil {
				return fmt.Errorf("cgroup %s: %w", path, err)
			}
		}
		return nil
	}
	for _, dir := range v2Dirs(root, path) {
		f := filepath.Join(dir, "cpu.max")
		if _, err := os.Stat(f); err != nil {
			continue
		}
		if err := os.WriteFile(f, []byte(fmt.Sprintf("%d %d", quota, period)), 0); err != nil {
			return fmt.Errorf("cgroup %s: %w", path, err)
		}
		return nil
	}
	return fmt.Errorf("cgroup %s: no cpu controller (v1 cpu.cfs_period_us or v2 cpu.max): %w", path, errdefs.ErrNotFound)
}

// CPULimit is the cgroup's CPU limit: quota µs per period µs (quota 0:
// none).
func CPULimit(root, path string) (quota int64, period uint64, err error) {
	for _, ctl := range cpuV1Dirs {
		dir := filepath.Join(root, ctl, path)
		p, ok := readInt(filepath.Join(dir, "cpu.cfs_period_us"))
		if !ok {
			continue
		}
		q, _ := readInt(filepath.Join(dir, "cpu.cfs_quota_us"))
		return max(q, 0), uint64(p), nil
	}
	for _, dir := range v2Dirs(root, path) {
		b, err := os.ReadFile(filepath.Join(dir, "cpu.max"))
		if err != nil {
			continue
		}
		f := strings.Fields(string(b))
		if len(f) != 2 {
			return 0, 0, fmt.Errorf("cgroup %s: cpu.max %q", path, b)
		}
		p, err := strconv.ParseUint(f[1], 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("cgroup %s: cpu.max %q", path, b)
		}
		q, _ := strconv.ParseInt(f[0], 10, 64) // "max": none
		return q, p, nil
	}
	return 0, 0, fmt.Errorf("cgroup %s: no cpu controller: %w", path, errdefs.ErrNotFound)
}

// CPUThrottled is how long the cgroup's CPU limit has held its tasks back
// in all: v1 cpu.stat throttled_time (ns), else v2 throttled_usec.
func CPUThrottled(root, path string) (time.Duration, error) {
	for _, ctl := range cpuV1Dirs {
		if n, ok := statField(filepath.Join(root, ctl, path, "cpu.stat"), "throttled_time"); ok {
			return time.Duration(n), nil
		}
	}
	for _, dir := range v2Dirs(root, path) {
		if n, ok := statField(filepath.Join(dir, "cpu.stat"), "throttled_usec"); ok {
			return time.Duration(n) * time.Microsecond, nil
		}
	}
	return 0, fmt.Errorf("cgroup %s: no throttling counter in cpu.stat: %w", path, errdefs.ErrNotFound)
}
