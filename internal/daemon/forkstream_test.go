package daemon

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/forkbox/forkbox/errdefs"
)

// runCounter is a fake runtime that counts container starts and fails the
// ones listed in fail (1-based start numbers).
type runCounter struct {
	memRuntime
	runs *atomic.Int32
	fail map[int32]bool
}

func (r runCounter) Run(ctx context.Context, id, bundle string) error {
	if n := r.runs.Add(1); r.fail[n] {
		return fmt.Errorf("start %d refused by the test: %w", n, errdefs.ErrUnavailable)
	}
	return r.memRuntime.Run(ctx, id, bundle)
}

// The first child's result is reported before the last child starts: with
// 3×forkParallelism children, when child results begin to arrive at most
// forkParallelism children have started (ordering, not timing). A child
// that fails is reported as failed, alone.
func TestForkStreamOrderAndErrors(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	var runs atomic.Int32
	rts := h.runtimes(RuntimeGVisor, RuntimeCrun)
	rts[RuntimeGVisor] = runCounter{memRuntime: rts[RuntimeGVisor].(memRuntime), runs: &runs, fail: map[int32]bool{3: true}}
	h.reopen(rts)
	h.create(CreateOptions{Name: "src"}) // start 1
	count := 3 * forkParallelism
	var mu sync.Mutex
	var order []string
	startsAtFirst := int32(-1)
	seen := map[int]bool{}
	res, err := h.d.ForkStream(ctx, ForkOptions{Source: "src", Count: count}, ForkEvents{
		Captured: func(r *ForkResult) {
			mu.Lock()
			defer mu.Unlock()
			order = append(order, "captured")
			if r.Checkpoint == nil || runs.Load() != 1 {
				t.Errorf("captured: checkpoint %v after %d starts, want a checkpoint before any child start", r.Checkpoint, runs.Load())
			}
		},
		Child: func(i int, c ForkChild) {
			mu.Lock()
			defer mu.Unlock()
			if len(order) == 1 {
				startsAtFirst = runs.Load() - 1 // the source's start is not a child's
			}
			if seen[i] {
				t.Errorf("child %d reported twice", i)
			}
			seen[i] = true
			order = append(order, fmt.Sprintf("child %d", i))
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(order) != count+1 || order[0] != "captured" {
		t.Fatalf("events %v: want captured then %d children", order, count)
	}
	if startsAtFirst < 1 || int(startsAtFirst) > forkParallelism {
		t.Errorf("the first child was reported after %d child starts, want 1 to %d (of %d)", startsAtFirst, forkParallelism, count)
	}
	failed := 0
	for i, c := range res.Children {
		switch {
		case c.Err != nil && errors.Is(c.Err, errdefs.ErrUnavailable):
			failed++
		case c.Err != nil:
			t.Errorf("child %d: %v", i, c.Err)
		case c.Sandbox == nil:
			t.Errorf("child %d: neither a sandbox nor an error", i)
		}
	}
	if failed != 1 {
		t.Errorf("%d children failed, want the one whose start was refused", failed)
	}
}

// Children without a slot are reported, each with its own error, before the
// others start.
func TestForkStreamNoSlot(t *testing.T) {
	h := newHarness(t)
	h.cfg.MaxSandboxes = 3
	h.reopen(h.runtimes(RuntimeGVisor, RuntimeCrun))
	h.create(CreateOptions{Name: "src"})
	var got []int
	res, err := h.d.ForkStream(context.Background(), ForkOptions{Source: "src", Count: 4, BestEffort: true}, ForkEvents{
		Child: func(i int, c ForkChild) {
			got = append(got, i)
			if (i >= 2) != errdefs.IsResourceExhausted(c.Err) {
				t.Errorf("child %d: err %v; want ResourceExhausted for children 2 and 3 only", i, c.Err)
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 4 || got[0] < 2 || got[1] < 2 {
		t.Errorf("report order %v: want the two without a slot first", got)
	}
	started := 0
	for _, c := range res.Children {
		if c.Sandbox != nil {
			started++
		}
	}
	if started != 2 {
		t.Errorf("%d children started, want 2", started)
	}
}
