package cgroups

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/forkbox/forkbox/errdefs"
)

// A cgroup's CPU limit (CFS bandwidth): quota µs of CPU time per period µs.
// The OCI runtime sets it when it makes the cgroup; the daemon raises the
// quota of a gVisor sandbox for its start and sets it back once the sandbox
// is up (internal/daemon/cpulimit.go). The period is never changed: the
// kernel does not re-arm a group's period timer when its period shrinks.

// cpuV1Dirs are the v1 cpu controller's hierarchies, alone or co-mounted.
var cpuV1Dirs = []string{"cpu", "cpu,cpuacct"}

// SetCPUQuota sets the cgroup's CPU quota to quota µs per period µs: v1
// cpu.cfs_quota_us (the cgroup's period must be period already: it is not
// written), else v2 cpu.max. Any write of the quota gives the cgroup a
// fresh period's worth at once, so lowering it never stalls the cgroup
// until a period ends.
func SetCPUQuota(root, path string, quota int64, period uint64) error {
	if quota <= 0 || period == 0 {
		return fmt.Errorf("cgroup %s: cpu limit %d/%d µs: %w", path, quota, period, errdefs.ErrInvalidArgument)
	}
	for _, ctl := range cpuV1Dirs {
		dir := filepath.Join(root, ctl, path)
		cur, ok := readInt(filepath.Join(dir, "cpu.cfs_period_us"))
		if !ok {
			continue
		}
		if cur != int64(period) {
			return fmt.Errorf("cgroup %s: cpu period %d µs, not %d: %w", path, cur, period, errdefs.ErrFailedPrecondition)
		}
		if err := os.WriteFile(filepath.Join(dir, "cpu.cfs_quota_us"), []byte(strconv.FormatInt(quota, 10)), 0); err != nil {
			return fmt.Errorf("cgroup %s: %w", path, err)
		}
		return nil
	}
	for _, dir := range v2Dirs(root, path) {
		f := filepath.Join(dir, "cpu.max")
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		if cur := strings.Fields(string(b)); len(cur) != 2 || cur[1] != strconv.FormatUint(period, 10) {
			return fmt.Errorf("cgroup %s: cpu.max %q, not a period of %d: %w", path, strings.TrimSpace(string(b)), period, errdefs.ErrFailedPrecondition)
		}
		if err := os.WriteFile(f, []byte(fmt.Sprintf("%d %d", quota, period)), 0); err != nil {
			return fmt.Errorf("cgroup %s: %w", path, err)
		}
		return nil
	}
	return fmt.Errorf("cgroup %s: no cpu controller (v1 cpu.cfs_quota_us or v2 cpu.max): %w", path, errdefs.ErrNotFound)
}

// CPUCeiling is the largest CPU share (cores) a new cgroup at path may be
// given: on v1 the kernel refuses a quota above any limited ancestor's
// share (EINVAL), so it is the lowest share among path's ancestors that
// exist; on v2 a larger quota is accepted (the ancestors' limits apply
// anyway), so it is +Inf, as it is when no ancestor is limited. It is 0
// when root has no cpu controller where SetCPUQuota looks.
func CPUCeiling(root, path string) float64 {
	for _, ctl := range cpuV1Dirs {
		if _, err := os.Stat(filepath.Join(root, ctl, "cpu.cfs_quota_us")); err != nil {
			continue
		}
		ceiling := math.Inf(1)
		for p := filepath.Dir(filepath.Clean("/" + path)); ; p = filepath.Dir(p) {
			dir := filepath.Join(root, ctl, p)
			q, qok := readInt(filepath.Join(dir, "cpu.cfs_quota_us"))
			per, pok := readInt(filepath.Join(dir, "cpu.cfs_period_us"))
			if qok && pok && q > 0 && per > 0 {
				ceiling = min(ceiling, float64(q)/float64(per))
			}
			if p == "/" {
				return ceiling
			}
		}
	}
	if v2CPU(root) {
		return math.Inf(1)
	}
	return 0
}

// v2CPU reports whether root (v2) or its unified mount (hybrid) offers
// the cpu controller.
func v2CPU(root string) bool {
	for _, dir := range v2Dirs(root, "/") {
		b, err := os.ReadFile(filepath.Join(dir, "cgroup.controllers"))
		if err == nil && slices.Contains(strings.Fields(string(b)), "cpu") {
			return true
		}
	}
	return false
}
