package cgroups

import (
	"bufio"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/forkbox/forkbox/errdefs"
)

// Reading a cgroup's usage counters, on v1 (one hierarchy per controller),
// hybrid (v1 plus a unified mount, where v2 files may live) and v2. Every
// reader takes the hierarchies' root (Root, or another in tests) and the
// cgroup's path below it ("/forkbox/sb-1"). A counter that no hierarchy
// has is NotFound.

// CPUNanos is the CPU time used by the cgroup, in nanoseconds: v1
// cpuacct.usage, else v2 cpu.stat usage_usec.
func CPUNanos(root, path string) (int64, error) {
	for _, ctl := range []string{"cpuacct", "cpu,cpuacct"} {
		if n, ok := readInt(filepath.Join(root, ctl, path, "cpuacct.usage")); ok {
			return n, nil
		}
	}
	for _, dir := range v2Dirs(root, path) {
		if n, ok := statField(filepath.Join(dir, "cpu.stat"), "usage_usec"); ok {
			return n * 1000, nil
		}
	}
	return 0, fmt.Errorf("cgroup %s: no cpuacct.usage or cpu.stat: %w", path, errdefs.ErrNotFound)
}

// CPUThrottled is how long the cgroup's CPU limit has held its tasks back
// in all: v1 cpu.stat throttled_time (ns), else v2 throttled_usec.
func CPUThrottled(root, path string) (time.Duration, error) {
	for _, ctl := range []string{"cpu", "cpu,cpuacct"} {
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

// Memory is the memory charged to the cgroup and its limit (0: none): v1
// memory.usage_in_bytes and memory.limit_in_bytes, else v2 memory.current
// and memory.max.
func Memory(root, path string) (used, limit int64, err error) {
	dir := filepath.Join(root, "memory", path)
	if n, ok := readInt(filepath.Join(dir, "memory.usage_in_bytes")); ok {
		l, _ := readInt(filepath.Join(dir, "memory.limit_in_bytes"))
		return n, unlimited(l), nil
	}
	for _, dir := range v2Dirs(root, path) {
		if n, ok := readInt(filepath.Join(dir, "memory.current")); ok {
			l, _ := readInt(filepath.Join(dir, "memory.max"))
			return n, unlimited(l), nil
		}
	}
	return 0, 0, fmt.Errorf("cgroup %s: no memory usage file: %w", path, errdefs.ErrNotFound)
}

// Pids is the number of tasks (threads) in the cgroup and its limit (0:
// none): pids.current and pids.max, of the v1 pids controller or v2.
func Pids(root, path string) (current, limit int64, err error) {
	for _, dir := range append([]string{filepath.Join(root, "pids", path)}, v2Dirs(root, path)...) {
		if n, ok := readInt(filepath.Join(dir, "pids.current")); ok {
			l, _ := readInt(filepath.Join(dir, "pids.max"))
			return n, unlimited(l), nil
		}
	}
	return 0, 0, fmt.Errorf("cgroup %s: no pids.current: %w", path, errdefs.ErrNotFound)
}

// v2Dirs are where a v2 cgroup's files may be: at the root (v2) or in a
// hybrid host's unified mount.
func v2Dirs(root, path string) []string {
	return []string{filepath.Join(root, path), filepath.Join(root, "unified", path)}
}

// unlimited maps the "no limit" values of the limit files (v1's huge
// page-rounded maximum, v2's "max", which does not parse) to 0.
func unlimited(n int64) int64 {
	if n <= 0 || n >= math.MaxInt64/2 {
		return 0
	}
	return n
}

func readInt(file string) (int64, bool) {
	b, err := os.ReadFile(file)
	if err != nil {
		return 0, false
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return n, err == nil
}

func statField(file, key string) (int64, bool) {
	f, err := os.Open(file)
	if err != nil {
		return 0, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), key+" "); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}
