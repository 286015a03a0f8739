package cgroups

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/runtime/testsuite"
)

// TestCPULimitFiles reads and writes the limit and the throttling counter
// in a v1 tree, a v2 tree and a hybrid one.
func TestCPULimitFiles(t *testing.T) {
	const cg = "/forkbox/sb-1"
	cases := []struct {
		name      string
		files     map[string]string
		limitFile string
		want      string
		throttled time.Duration
	}{
		{"v1", map[string]string{
			"cpu,cpuacct" + cg + "/cpu.cfs_quota_us":  "1000000\n",
			"cpu,cpuacct" + cg + "/cpu.cfs_period_us": "1000000\n",
			"cpu,cpuacct" + cg + "/cpu.stat":          "nr_periods 3\nnr_throttled 1\nthrottled_time 11383318\n",
		}, "cpu,cpuacct" + cg + "/cpu.cfs_period_us", "100000", 11383318},
		{"v2", map[string]string{
			cg + "/cpu.max":  "1000000 1000000\n",
			cg + "/cpu.stat": "usage_usec 10\nthrottled_usec 250\n",
		}, cg + "/cpu.max", "50000 100000", 250 * time.Microsecond},
		{"hybrid", map[string]string{
			"unified" + cg + "/cpu.max":  "max 100000\n",
			"unified" + cg + "/cpu.stat": "throttled_usec 0\n",
		}, "unified" + cg + "/cpu.max", "50000 100000", 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			root := t.TempDir()
			writeFiles(t, root, c.files)
			quota := int64(50000)
			if c.name == "v1" {
				quota = 100000
			}
			if err := SetCPULimit(root, cg, quota, 100000); err != nil {
				t.Fatal(err)
			}
			b, _ := os.ReadFile(filepath.Join(root, c.limitFile))
			if got := strings.TrimSpace(string(b)); got != c.want {
				t.Errorf("%s = %q, want %q", c.limitFile, got, c.want)
			}
			q, p, err := CPULimit(root, cg)
			if err != nil || q != quota || p != 100000 {
				t.Errorf("CPULimit = %d, %d, %v; want %d, 100000", q, p, err, quota)
			}
			if got, err := CPUThrottled(root, cg); err != nil || got != c.throttled {
				t.Errorf("CPUThrottled = %v, %v; want %v", got, err, c.throttled)
			}
		})
	}
	root := t.TempDir()
	if err := SetCPULimit(root, cg, 1000, 100000); !errdefs.IsNotFound(err) {
		t.Errorf("no cgroup: got %v, want NotFound", err)
	}
	if err := SetCPULimit(root, cg, 0, 100000); !errdefs.IsInvalidArgument(err) {
		t.Errorf("quota 0: got %v, want InvalidArgument", err)
	}
	if _, err := CPUThrottled(root, cg); !errdefs.IsNotFound(err) {
		t.Errorf("CPUThrottled of no cgroup: got %v, want NotFound", err)
	}
}

// TestSetCPULimitRealCgroup changes a real cgroup's period both ways under
// a parent limited to one CPU: the kernel refuses any moment where the
// child's share exceeds the parent's, so the files must be written in the
// right order (a child of 1 CPU over 1 s going to 1 CPU over 100 ms passes
// through 10 CPUs if the period is written first).
func TestSetCPULimitRealCgroup(t *testing.T) {
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
		testsuite.Need(t, hasCPUController(Root), "no cgroup hierarchy with the cpu controller under "+Root)
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
	if v2 {
		os.WriteFile(filepath.Join(base, parent, "cgroup.subtree_control"), []byte("+cpu"), 0)
	}
	mk(child)
	if err := SetCPULimit(Root, parent, 100000, 100000); err != nil {
		t.Fatal(err)
	}
	for _, step := range []struct{ quota, period int64 }{
		{1000000, 1000000}, // the start period: the same one CPU
		{100000, 100000},   // back: the quota must go first
		{1000000, 1000000}, // and out again: the period must go first
		{50000, 100000},
	} {
		if err := SetCPULimit(Root, child, step.quota, uint64(step.period)); err != nil {
			t.Fatalf("set %d/%d: %v", step.quota, step.period, err)
		}
		q, p, err := CPULimit(Root, child)
		if err != nil || q != step.quota || int64(p) != step.period {
			t.Fatalf("after setting %d/%d: got %d/%d, %v", step.quota, step.period, q, p, err)
		}
	}
	if _, err := CPUThrottled(Root, child); err != nil {
		t.Errorf("CPUThrottled: %v", err)
	}
}

func hasCPUController(dir string) bool {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.controllers"))
	return err == nil && strings.Contains(" "+string(b)+" ", " cpu ")
}
