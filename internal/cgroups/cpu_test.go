package cgroups

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/runtime/testsuite"
)

// TestCPUQuotaFiles reads and writes the limit in a v1 tree, a v2 tree and
// a hybrid one, and the ceiling that limited v1 ancestors set.
func TestCPUQuotaFiles(t *testing.T) {
	const cg = "/forkbox/sb-1"
	cases := []struct {
		name      string
		files     map[string]string
		limitFile string
		want      string
		ceiling   float64
	}{
		{"v1", map[string]string{
			"cpu,cpuacct/cpu.cfs_quota_us":            "-1\n",
			"cpu,cpuacct/cpu.cfs_period_us":           "100000\n",
			"cpu,cpuacct/forkbox/cpu.cfs_quota_us":    "150000\n",
			"cpu,cpuacct/forkbox/cpu.cfs_period_us":   "100000\n",
			"cpu,cpuacct" + cg + "/cpu.cfs_quota_us":  "200000\n",
			"cpu,cpuacct" + cg + "/cpu.cfs_period_us": "100000\n",
		}, "cpu,cpuacct" + cg + "/cpu.cfs_quota_us", "50000", 1.5},
		{"v2", map[string]string{
			"cgroup.controllers": "cpuset cpu io memory pids\n",
			cg + "/cpu.max":      "200000 100000\n",
		}, cg + "/cpu.max", "50000 100000", math.Inf(1)},
		{"hybrid", map[string]string{
			"unified/cgroup.controllers": "cpu\n",
			"unified" + cg + "/cpu.max":  "max 100000\n",
		}, "unified" + cg + "/cpu.max", "50000 100000", math.Inf(1)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			root := t.TempDir()
			writeFiles(t, root, c.files)
			if err := SetCPUQuota(root, cg, 50000, 100000); err != nil {
				t.Fatal(err)
			}
			b, _ := os.ReadFile(filepath.Join(root, c.limitFile))
			if got := strings.TrimSpace(string(b)); got != c.want {
				t.Errorf("%s = %q, want %q", c.limitFile, got, c.want)
			}
			q, p, err := cpuLimit(root, cg)
			if err != nil || q != 50000 || p != 100000 {
				t.Errorf("cpuLimit = %d, %d, %v; want 50000, 100000", q, p, err)
			}
			if got := CPUCeiling(root, cg); got != c.ceiling {
				t.Errorf("CPUCeiling = %v, want %v", got, c.ceiling)
			}
		})
	}
	root := t.TempDir()
	if err := SetCPUQuota(root, cg, 1000, 100000); !errdefs.IsNotFound(err) {
		t.Errorf("no cgroup: got %v, want NotFound", err)
	}
	if err := SetCPUQuota(root, cg, 0, 100000); !errdefs.IsInvalidArgument(err) {
		t.Errorf("quota 0: got %v, want InvalidArgument", err)
	}
	if got := CPUCeiling(root, cg); got != 0 {
		t.Errorf("CPUCeiling without a cpu controller = %v, want 0", got)
	}
	writeFiles(t, root, map[string]string{"cpu" + cg + "/cpu.cfs_period_us": "1000000\n"})
	if err := SetCPUQuota(root, cg, 50000, 100000); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("v1, another period: got %v, want FailedPrecondition", err)
	}
	v2 := t.TempDir()
	writeFiles(t, v2, map[string]string{cg + "/cpu.max": "max 1000000\n"})
	if err := SetCPUQuota(v2, cg, 50000, 100000); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("v2, another period: got %v, want FailedPrecondition", err)
	}
}

// TestCPUQuotaRealCgroup raises and lowers a real cgroup's quota under a
// parent limited to 1.5 CPUs. On v1 the kernel refuses a child above its
// parent's share, so CPUCeiling must say 1.5; up to that the quota moves
// both ways at the same period.
func TestCPUQuotaRealCgroup(t *testing.T) {
	testsuite.Need(t, os.Geteuid() == 0, "needs root to make cgroups")
	parent := fmt.Sprintf("/forkbox-cputest-%d", os.Getpid())
	child := parent + "/sb"
	var made []string
	t.Cleanup(func() {
		for i := len(made) - 1; i >= 0; i-- {
			os.Remove(made[i])
		}
	})
	base, v2 := filepath.Join(Root, "cpu"), false
	if _, err := os.Stat(filepath.Join(base, "cpu.cfs_period_us")); err != nil {
		base, v2 = Root, true
		testsuite.Need(t, v2CPU(Root), "no cgroup hierarchy with the cpu controller under "+Root)
	}
	mk := func(p string) {
		dir := filepath.Join(base, p)
		if v2 { // the cpu controller for the new cgroup's children
			os.WriteFile(filepath.Join(filepath.Dir(dir), "cgroup.subtree_control"), []byte("+cpu"), 0)
		}
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatalf("make cgroup: %v", err)
		}
		made = append(made, dir)
	}
	mk(parent)
	mk(child)
	if err := SetCPUQuota(Root, parent, 150000, 100000); err != nil {
		t.Fatal(err)
	}
	want := 1.5
	if v2 {
		want = math.Inf(1)
	}
	if got := CPUCeiling(Root, child); got != want {
		t.Errorf("CPUCeiling under a parent of 1.5 CPUs = %v, want %v", got, want)
	}
	for _, quota := range []int64{50000, 150000, 50000} { // the limit, raised to the ceiling for a start, back
		if err := SetCPUQuota(Root, child, quota, 100000); err != nil {
			t.Fatalf("set %d: %v", quota, err)
		}
		if q, p, err := cpuLimit(Root, child); err != nil || q != quota || p != 100000 {
			t.Fatalf("after setting %d: got %d/%d, %v", quota, q, p, err)
		}
	}
	if !v2 {
		if err := SetCPUQuota(Root, child, 200000, 100000); err == nil {
			t.Error("v1 took a child quota above its parent's share: CPUCeiling's reason is gone")
		}
	}
}

// cpuLimit is the cgroup's CPU limit, as the tests read it back: quota
// µs per period µs (quota 0: none).
func cpuLimit(root, path string) (quota int64, period uint64, err error) {
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
