package cgroups

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/forkbox/forkbox/errdefs"
)

func writeFiles(t *testing.T, root string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// TestCounters reads the files of a v1 tree, a v2 tree and a hybrid one
// (v2 files in the unified mount), with and without limits.
func TestCounters(t *testing.T) {
	const cg = "/forkbox/sb-1"
	cases := []struct {
		name               string
		files              map[string]string
		cpu, mem, memLimit int64
		pids, pidsLimit    int64
	}{
		{"v1", map[string]string{
			"cpu,cpuacct" + cg + "/cpuacct.usage":    "2500000000\n",
			"memory" + cg + "/memory.usage_in_bytes": "1048576\n",
			"memory" + cg + "/memory.limit_in_bytes": "268435456\n",
			"pids" + cg + "/pids.current":            "7\n",
			"pids" + cg + "/pids.max":                "1024\n",
		}, 2500000000, 1 << 20, 256 << 20, 7, 1024},
		{"v1 unlimited", map[string]string{
			"cpuacct" + cg + "/cpuacct.usage":        "1\n",
			"memory" + cg + "/memory.usage_in_bytes": "4096\n",
			"memory" + cg + "/memory.limit_in_bytes": "9223372036854771712\n",
			"pids" + cg + "/pids.current":            "1\n",
			"pids" + cg + "/pids.max":                "max\n",
		}, 1, 4096, 0, 1, 0},
		{"v2", map[string]string{
			cg + "/cpu.stat":       "usage_usec 1500000\nuser_usec 1000000\n",
			cg + "/memory.current": "2097152\n",
			cg + "/memory.max":     "max\n",
			cg + "/pids.current":   "3\n",
			cg + "/pids.max":       "64\n",
		}, 1500000000, 2 << 20, 0, 3, 64},
		{"hybrid", map[string]string{
			"unified" + cg + "/cpu.stat":       "usage_usec 10\n",
			"unified" + cg + "/memory.current": "8192\n",
			"unified" + cg + "/memory.max":     "16384\n",
			"unified" + cg + "/pids.current":   "2\n",
		}, 10000, 8192, 16384, 2, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			root := t.TempDir()
			writeFiles(t, root, c.files)
			if n, err := CPUNanos(root, cg); err != nil || n != c.cpu {
				t.Errorf("CPUNanos: got %d %v, want %d", n, err, c.cpu)
			}
			if n, l, err := Memory(root, cg); err != nil || n != c.mem || l != c.memLimit {
				t.Errorf("Memory: got %d/%d %v, want %d/%d", n, l, err, c.mem, c.memLimit)
			}
			if n, l, err := Pids(root, cg); err != nil || n != c.pids || l != c.pidsLimit {
				t.Errorf("Pids: got %d/%d %v, want %d/%d", n, l, err, c.pids, c.pidsLimit)
			}
		})
	}
	root := t.TempDir()
	if _, err := CPUNanos(root, cg); !errdefs.IsNotFound(err) {
		t.Errorf("no cgroup: CPUNanos got %v, want NotFound", err)
	}
	if _, _, err := Memory(root, cg); !errdefs.IsNotFound(err) {
		t.Errorf("no cgroup: Memory got %v, want NotFound", err)
	}
	if _, _, err := Pids(root, cg); !errdefs.IsNotFound(err) {
		t.Errorf("no cgroup: Pids got %v, want NotFound", err)
	}
}

// TestCPUThrottled reads the throttled time of a v1, a v2 and a hybrid
// tree; a cgroup without one is NotFound.
func TestCPUThrottled(t *testing.T) {
	const cg = "/forkbox/sb-1"
	for _, c := range []struct {
		name  string
		files map[string]string
		want  time.Duration
	}{
		{"v1", map[string]string{"cpu,cpuacct" + cg + "/cpu.stat": "nr_periods 3\nnr_throttled 1\nthrottled_time 11383318\n"}, 11383318},
		{"v2", map[string]string{cg + "/cpu.stat": "usage_usec 10\nthrottled_usec 250\n"}, 250 * time.Microsecond},
		{"hybrid", map[string]string{"unified" + cg + "/cpu.stat": "throttled_usec 0\n"}, 0},
	} {
		root := t.TempDir()
		writeFiles(t, root, c.files)
		if got, err := CPUThrottled(root, cg); err != nil || got != c.want {
			t.Errorf("%s: %v, %v; want %v", c.name, got, err, c.want)
		}
	}
	if _, err := CPUThrottled(t.TempDir(), cg); !errdefs.IsNotFound(err) {
		t.Errorf("no cgroup: got %v, want NotFound", err)
	}
}
