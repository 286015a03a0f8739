package daemon

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/forkbox/forkbox/internal/runtime/spec"
)

// TestCPULimitPeriodAfterStart: a gVisor sandbox's spec accounts its CPU
// limit over the start period, and once it is up (created, memory-forked,
// its source restored in place, woken) its cgroup has the same share over
// the default period; crun's spec has the default period from the start.
func TestCPULimitPeriodAfterStart(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	steady := cpuLimit{50000, spec.CPUPeriod}
	check := func(what, id string, startPeriod uint64) {
		t.Helper()
		s, err := spec.ReadBundle(h.d.bundleDir(id))
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		cg := h.d.cgroupPath(id)
		if h.d.pooled(id) {
			if s, err = spec.ReadBundle(h.d.podBundleDir(id)); err != nil {
				t.Fatalf("%s: %v", what, err)
			}
		}
		if c := s.Linux.Resources.CPU; c == nil || *c.Period != startPeriod || *c.Quota != spec.CPUQuota(0.5, startPeriod) {
			t.Errorf("%s: spec's CPU limit %+v, want 0.5 CPU over %d µs", what, c, startPeriod)
		}
		if got, ok := h.w.cpuOf(cg); !ok || got != steady {
			t.Errorf("%s: cgroup %s CPU limit %+v (%v), want %+v", what, filepath.Base(cg), got, ok, steady)
		}
	}
	src := h.create(CreateOptions{Name: "src", CPU: "0.5"})
	check("created", src, spec.CPUStartPeriod)

	res, err := h.d.Fork(ctx, ForkOptions{Source: src, Count: 1, Memory: true})
	if err != nil {
		t.Fatal(err)
	}
	if c := res.Children[0]; c.Err != nil {
		t.Fatal(c.Err)
	} else {
		check("memory-forked child", c.Sandbox.ID, spec.CPUStartPeriod)
	}
	check("source restored in place", src, spec.CPUStartPeriod)

	w := h.create(CreateOptions{Name: "w", CPU: "0.5"})
	if _, err := h.d.Hibernate(ctx, w); err != nil {
		t.Fatal(err)
	}
	if _, err := h.d.Wake(ctx, w); err != nil {
		t.Fatal(err)
	}
	check("woken", w, spec.CPUStartPeriod)

	c := h.create(CreateOptions{Name: "c", CPU: "0.5", Runtime: RuntimeCrun})
	check("crun", c, spec.CPUPeriod)
}
