package daemon

import (
	"context"
	"testing"

	"github.com/forkbox/forkbox/internal/runtime/spec"
)

// TestMemoryChildTakesItsOwnCPU: a memory-fork child whose CPU is
// overridden restores with that limit in its spec, not the source's (the
// spec comes from the source's image).
func TestMemoryChildTakesItsOwnCPU(t *testing.T) {
	h := newHarness(t)
	src := h.create(CreateOptions{Name: "src", CPU: "1"})
	res, err := h.d.Fork(context.Background(), ForkOptions{Source: src, Count: 1, Memory: true, Overrides: Overrides{CPU: "0.25"}})
	if err != nil {
		t.Fatal(err)
	}
	c := res.Children[0]
	if c.Err != nil {
		t.Fatal(c.Err)
	}
	dir := h.d.bundleDir(c.Sandbox.ID)
	if h.d.pooled(c.Sandbox.ID) {
		dir = h.d.podBundleDir(c.Sandbox.ID)
	}
	s, err := spec.ReadBundle(dir)
	if err != nil {
		t.Fatal(err)
	}
	if cpu := s.Linux.Resources.CPU; c.Sandbox.Config.CPU != 0.25 || cpu == nil || *cpu.Quota != 25000 || *cpu.Period != spec.CPUPeriod {
		t.Errorf("child's config CPU %v, spec's limit %+v; want 0.25 and 25000 per %d µs", c.Sandbox.Config.CPU, cpu, spec.CPUPeriod)
	}
}
