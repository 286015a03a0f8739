package daemon

import (
	"context"
	"errors"
	"fmt"
	"math"
	goruntime "runtime"
	"slices"
	"strconv"
	"testing"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/runtime/runsc"
	"github.com/forkbox/forkbox/internal/runtime/spec"
	"github.com/forkbox/forkbox/internal/store"
)

// TestRestoreCPU: a gVisor start runs with one CPU more than the
// sandbox's limit (within the host's CPUs and a limited parent's share),
// and the sandbox has its own limit once it is up: a fresh boot (whose
// spec names the limit for runsc), a memory-fork child (whose limit is
// its own, not the source's image's), the source restored in place, a
// woken sandbox. crun keeps its limit from the start. Reconcile sets the
// limit of a sandbox the daemon died with before it could.
func TestRestoreCPU(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	raised := func(cores float64) int64 {
		return spec.CPUQuota(min(cores+1, float64(goruntime.NumCPU())))
	}
	check := func(what, id string, want ...int64) {
		t.Helper()
		if got := h.w.cpuOf(h.d.cgroupPath(id)); !slices.Equal(got, want) {
			t.Errorf("%s: cgroup's CPU quotas %v, want %v", what, got, want)
		}
	}
	// named is the annotation of a start of limit cores: its quota when
	// it is raised (on a host of one CPU, a limit of 1 is not).
	named := func(cores float64) string {
		if raised(cores) > spec.CPUQuota(cores) {
			return strconv.FormatInt(spec.CPUQuota(cores), 10)
		}
		return ""
	}
	// checkAnnotation: the limit a raised start names for runsc ("" none).
	checkAnnotation := func(what, id, want string) {
		t.Helper()
		s, err := spec.ReadBundle(h.d.bundleDir(id))
		if err != nil {
			t.Fatal(err)
		}
		if got := s.Annotations[runsc.AnnotationCPULimit]; got != want {
			t.Errorf("%s: spec's %s = %q, want %q", what, runsc.AnnotationCPULimit, got, want)
		}
	}
	src := h.create(CreateOptions{Name: "src", CPU: "1"})
	check("fresh boot", src, raised(1), 100000)
	checkAnnotation("fresh boot", src, named(1))

	c := memoryChild(t, h, src, "0.25")
	if c.Config.CPU != 0.25 {
		t.Errorf("child's CPU %v, want the override 0.25", c.Config.CPU)
	}
	check("memory-fork child", c.ID, raised(0.25), 25000)
	checkAnnotation("memory-fork child", c.ID, named(0.25))
	check("source restored in place", src, raised(1), 100000, raised(1), 100000)

	w := h.create(CreateOptions{Name: "w", CPU: "0.5"})
	if _, err := h.d.Hibernate(ctx, w); err != nil {
		t.Fatal(err)
	}
	if _, err := h.d.Wake(ctx, w); err != nil {
		t.Fatal(err)
	}
	check("woken", w, raised(0.5), 50000, raised(0.5), 50000)

	cr := h.create(CreateOptions{Name: "c", CPU: "0.5", Runtime: RuntimeCrun})
	check("crun", cr, 50000)

	// Under a parent limited to 0.5 CPU, a child of 0.25 restores with 0.5;
	// one of 0.5 is not raised at all (and is given its limit again).
	h.w.mu.Lock()
	h.w.ceiling = 0.5
	h.w.mu.Unlock()
	for _, cores := range []string{"0.25", "0.5"} {
		s := h.create(CreateOptions{Name: "src-" + cores, CPU: "0.5"})
		c := memoryChild(t, h, s, cores)
		if cores == "0.25" {
			check("child under a limited parent", c.ID, 50000, 25000)
		} else {
			check("child at its parent's share", c.ID, 50000, 50000)
			checkAnnotation("child at its parent's share", c.ID, "")
		}
	}
	// w's bundle holds the raised quota of its last wake, which the
	// parent's share no longer allows: the next wake restores at the limit.
	if _, err := h.d.Hibernate(ctx, w); err != nil {
		t.Fatal(err)
	}
	if _, err := h.d.Wake(ctx, w); err != nil {
		t.Fatal(err)
	}
	check("woken under a limited parent", w, raised(0.5), 50000, raised(0.5), 50000, 50000, 50000)
	checkAnnotation("woken under a limited parent", w, "")
	h.w.mu.Lock()
	h.w.ceiling = math.Inf(1)
	h.w.mu.Unlock()

	// A daemon that died after a restore and before the limit: the cgroup
	// still has the raised quota; reconcile sets the limit.
	if err := h.w.SetCPUQuota(h.d.cgroupPath(src), raised(1), spec.CPUPeriod); err != nil {
		t.Fatal(err)
	}
	h.reopen(h.runtimes(RuntimeGVisor, RuntimeCrun))
	if got := h.w.cpuOf(h.d.cgroupPath(src)); got[len(got)-1] != 100000 {
		t.Errorf("after reconcile the source's quotas are %v, want the limit 100000 last", got)
	}
}

// TestCPUWithoutThePatch: with a runsc that does not take the CPU limit
// annotation, a fresh boot runs at its limit (its tenant would see a
// raised quota for good) and a restore is still raised, without the
// annotation. A limit that cannot be set back fails the start, which
// leaves nothing running.
func TestCPUWithoutThePatch(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	h.w.mu.Lock()
	h.w.noCPULimitPatch = true
	h.w.mu.Unlock()
	src := h.create(CreateOptions{Name: "src", CPU: "0.5"})
	if got := h.w.cpuOf(h.d.cgroupPath(src)); !slices.Equal(got, []int64{50000, 50000}) {
		t.Errorf("fresh boot without the patch: quotas %v, want [50000 50000]", got)
	}
	c := memoryChild(t, h, src, "0.25")
	want := []int64{spec.CPUQuota(min(1.25, float64(goruntime.NumCPU()))), 25000}
	if got := h.w.cpuOf(h.d.cgroupPath(c.ID)); !slices.Equal(got, want) {
		t.Errorf("restore without the patch: quotas %v, want %v", got, want)
	}
	s, err := spec.ReadBundle(h.d.bundleDir(c.ID))
	if err != nil {
		t.Fatal(err)
	}
	if v, ok := s.Annotations[runsc.AnnotationCPULimit]; ok {
		t.Errorf("restore without the patch: spec names the limit %q", v)
	}

	live := h.liveCount()
	h.w.mu.Lock()
	h.w.quotaErr = fmt.Errorf("write cpu.cfs_quota_us: %w", errdefs.ErrInternal)
	h.w.mu.Unlock()
	if _, err := h.d.Create(ctx, CreateOptions{Name: "stuck", Image: "unit:1", CPU: "0.5"}); !errors.Is(err, errdefs.ErrInternal) {
		t.Errorf("create whose limit cannot be set: %v, want the write's Internal error", err)
	}
	if n := h.liveCount(); n != live {
		t.Errorf("after the failed create %d sandboxes live, want %d", n, live)
	}
}

// memoryChild memory-forks one child of src with a CPU limit of cpu.
func memoryChild(t *testing.T, h *harness, src, cpu string) *store.Sandbox {
	t.Helper()
	res, err := h.d.Fork(context.Background(), ForkOptions{Source: src, Count: 1, Memory: true, Overrides: Overrides{CPU: cpu}})
	if err != nil {
		t.Fatal(err)
	}
	c := res.Children[0]
	if c.Err != nil {
		t.Fatal(c.Err)
	}
	return c.Sandbox
}
