package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// What the density section reads from the host: free memory, the daemon's
// resident memory, and the sandboxes' parent cgroup's memory and CPU.

// memAvailableGiB is the host's MemAvailable.
func memAvailableGiB() float64 { return meminfo()["MemAvailable"] }

// rssMiB is a process's resident memory (0 when unknown).
func rssMiB(pid int) float64 {
	if pid <= 0 {
		return 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			return kb / 1024
		}
	}
	return 0
}

// cgroupMemMiB is the memory usage of a cgroup (v1) below every hierarchy's
// root (0 when unknown).
func cgroupMemMiB(name string) float64 {
	b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/memory", name, "memory.usage_in_bytes"))
	if err != nil {
		return 0
	}
	n, _ := strconv.ParseFloat(strings.TrimSpace(string(b)), 64)
	return n / (1 << 20)
}

// idleCPU is the CPU (ms per second) a cgroup (v1 cpuacct) used over a
// window in which nothing is asked of its sandboxes (0 when unknown).
func idleCPU(ctx context.Context, name string, window time.Duration) float64 {
	read := func() (float64, bool) {
		b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/cpuacct", name, "cpuacct.usage"))
		if err != nil {
			return 0, false
		}
		n, err := strconv.ParseFloat(strings.TrimSpace(string(b)), 64)
		return n, err == nil
	}
	a, ok := read()
	t := time.Now()
	select {
	case <-ctx.Done():
		return 0
	case <-time.After(window): // the measurement window itself
	}
	z, ok2 := read()
	if !ok || !ok2 {
		return 0
	}
	return (z - a) / 1e6 / time.Since(t).Seconds()
}
