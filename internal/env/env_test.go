package env

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/store"
)

var bg = context.Background()

func TestDefinitionChecks(t *testing.T) {
	_, m := newFake(t)
	many := def("many")
	for range maxSteps + 1 {
		many.Steps = append(many.Steps, SetupStep{Run: "true"})
	}
	big := def("big")
	big.Steps = []SetupStep{{WritePath: "/x", WriteContent: make([]byte, maxDefinitionBytes+1)}}
	for _, tc := range []struct {
		name  string
		def   Definition
		class func(error) bool
	}{
		{"bad name", def("../x"), errdefs.IsInvalidArgument},
		{"empty name", def(""), errdefs.IsInvalidArgument},
		{"pool too big", Definition{Name: "p", Image: "busybox", PoolSize: maxPoolSize + 1}, errdefs.IsInvalidArgument},
		{"negative pool", Definition{Name: "p", Image: "busybox", PoolSize: -1}, errdefs.IsInvalidArgument},
		{"negative max age", Definition{Name: "p", Image: "busybox", MaxAge: -time.Second}, errdefs.IsInvalidArgument},
		{"step with both", Definition{Name: "p", Image: "busybox", Steps: []SetupStep{{Run: "x", WritePath: "/y"}}}, errdefs.IsInvalidArgument},
		{"empty step", Definition{Name: "p", Image: "busybox", Steps: []SetupStep{{}}}, errdefs.IsInvalidArgument},
		{"too many steps", many, errdefs.IsResourceExhausted},
		{"too many bytes", big, errdefs.IsResourceExhausted},
		{"no image", Definition{Name: "p"}, errdefs.IsInvalidArgument},
		{"unknown image", Definition{Name: "p", Image: "missing"}, errdefs.IsNotFound},
	} {
		_, _, err := m.Build(bg, tc.def, false, nil)
		if !tc.class(err) {
			t.Errorf("%s: got %v, want an error of the right class", tc.name, err)
		}
	}
	if envs, _ := m.List(bg); len(envs) != 0 {
		t.Errorf("bad definitions were recorded: %d environments", len(envs))
	}
}

func TestConcurrentCallersShareOneBuild(t *testing.T) {
	f, m := newFake(t)
	gate, entered := make(chan struct{}), make(chan struct{}, 1)
	f.onExec = func(ctx context.Context, shell string) (int, error) {
		if shell == "slow" {
			entered <- struct{}{}
			<-gate
		}
		return 0, nil
	}
	d := def("shared", "true", "slow")
	const n = 4
	type result struct {
		st    *Status
		built bool
		err   error
	}
	results := make([]result, n)
	var wg sync.WaitGroup
	run := func(i int, progress func(Progress)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st, built, err := m.Build(bg, d, false, progress)
			results[i] = result{st, built, err}
		}()
	}
	run(0, nil)
	<-entered // the first caller's build is running
	waiting := make(chan struct{}, n)
	for i := 1; i < n; i++ {
		run(i, func(p Progress) {
			if p.Phase == "wait" {
				waiting <- struct{}{}
			}
		})
	}
	for i := 1; i < n; i++ {
		<-waiting
	}
	close(gate)
	wg.Wait()
	built := 0
	for i, r := range results {
		if r.err != nil {
			t.Fatalf("caller %d: %v", i, r.err)
		}
		if r.built {
			built++
		}
		if r.st.Rec.Checkpoint != results[0].st.Rec.Checkpoint || r.st.Rec.State != store.EnvReady {
			t.Errorf("caller %d: got %s %s, want ready %s", i, r.st.Rec.State, r.st.Rec.Checkpoint, results[0].st.Rec.Checkpoint)
		}
	}
	if built != 1 || len(f.builders) != 1 {
		t.Errorf("got %d callers that built and %d builders, want 1 and 1", built, len(f.builders))
	}
	if len(f.live(t)) != 0 {
		t.Errorf("the builder outlived its build")
	}
}

func TestAppendedStepsStartFromTheBuiltPrefix(t *testing.T) {
	f, m := newFake(t)
	st, built, err := m.Build(bg, def("prefix", "a", "b"), false, nil)
	if err != nil || !built {
		t.Fatalf("first build: %v (built %v)", err, built)
	}
	first := st.Rec.Checkpoint
	st, built, err = m.Build(bg, def("prefix", "a", "b", "c"), false, nil)
	if err != nil || !built {
		t.Fatalf("second build: %v (built %v)", err, built)
	}
	if f.builders[1] != first {
		t.Errorf("second builder started from %q, want the two-step snapshot %q", f.builders[1], first)
	}
	if got := strings.Join(f.execs, ","); got != "a,b,c" {
		t.Errorf("commands run: got %s, want a,b,c (a and b once)", got)
	}
	if st.Rec.CachedSteps != 2 || st.Rec.Checkpoint == first {
		t.Errorf("got cached steps %d and checkpoint %s", st.Rec.CachedSteps, st.Rec.Checkpoint)
	}
	// The same definition again: cached, nothing runs.
	if _, built, err := m.Build(bg, def("prefix", "a", "b", "c"), false, nil); err != nil || built {
		t.Errorf("a built definition: got built %v, %v", built, err)
	}
}

func TestFailedStepFailsTheBuild(t *testing.T) {
	f, m := newFake(t)
	_, _, err := m.Build(bg, def("fails", "true", "exit 3"), false, nil)
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "exited 3") || !strings.Contains(err.Error(), "ran exit 3") {
		t.Fatalf("got %v, want FailedPrecondition naming the exit code and the output", err)
	}
	st, err := m.Get(bg, "fails")
	if err != nil || st.Rec.State != store.EnvFailed || st.Rec.Checkpoint != "" {
		t.Fatalf("record after a failed build: %+v, %v", st, err)
	}
	if len(f.live(t)) != 0 {
		t.Errorf("the builder of a failed build is still live")
	}
	if _, err := m.Sandbox(bg, nil, "fails", Overrides{}); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("a hand-over of a failed environment: got %v, want FailedPrecondition", err)
	}
	// The complete prefix (step 1) was kept: a fixed step 2 starts there.
	if _, _, err := m.Build(bg, def("fails", "true", "true"), false, nil); err != nil {
		t.Fatal(err)
	}
	if f.builders[len(f.builders)-1] == "" {
		t.Errorf("the rebuild did not start from the step-1 snapshot")
	}
}

func TestPoolRefillsAndDeleteLeavesNoPooledSandbox(t *testing.T) {
	f, m := newFake(t)
	f.started, f.closed = make(chan string, 16), make(chan string, 16)
	var block atomic.Bool
	gate, blocked := make(chan struct{}), make(chan struct{}, 1)
	f.onStart = func(ctx context.Context, pool string) error {
		if pool != "" && block.Load() {
			blocked <- struct{}{}
			<-gate
		}
		return nil
	}
	d := def("pool", "true")
	d.PoolSize = 2
	if _, _, err := m.Build(bg, d, false, nil); err != nil {
		t.Fatal(err)
	}
	<-f.started
	<-f.started
	if st, _ := m.Get(bg, "pool"); st.PoolReady != 2 {
		t.Fatalf("pool ready: got %d, want 2", st.PoolReady)
	}
	block.Store(true)
	res, err := m.Sandbox(bg, nil, "pool", Overrides{})
	if err != nil || !res.FromPool {
		t.Fatalf("hand-over: %+v, %v; want one from the pool", res, err)
	}
	<-blocked // the refill is starting a replacement
	done := make(chan error, 1)
	go func() { done <- m.Delete(bg, "pool") }()
	close(gate)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	for _, sb := range f.live(t) {
		if sb.ID != res.Sandbox.ID {
			t.Errorf("sandbox %s (%s, pool %q) outlived its environment", sb.ID, sb.Name, sb.Pool)
		}
	}
	if _, err := m.Get(bg, "pool"); !errdefs.IsNotFound(err) {
		t.Errorf("deleted environment: got %v, want NotFound", err)
	}
}

func TestHandoverWithOverridesStartsFresh(t *testing.T) {
	f, m := newFake(t)
	if _, _, err := m.Build(bg, def("ov", "true"), false, nil); err != nil {
		t.Fatal(err)
	}
	res, err := m.Sandbox(bg, nil, "ov", Overrides{Name: "mine"})
	if err != nil || res.FromPool || res.Sandbox.Name != "mine" || res.Sandbox.FromCheckpoint != res.Env.Rec.Checkpoint {
		t.Fatalf("got %+v, %v", res, err)
	}
	res, err = m.Sandbox(bg, nil, "ov", Overrides{})
	if err != nil || !strings.HasPrefix(res.Sandbox.Name, "ov-") {
		t.Fatalf("default name: got %+v, %v", res, err)
	}
	if len(f.live(t)) != 2 {
		t.Errorf("got %d live sandboxes, want the 2 handed over", len(f.live(t)))
	}
}

func TestMaxAgeRebuildsInTheBackground(t *testing.T) {
	f, m := newFake(t)
	f.closed = make(chan string, 16)
	d := def("aged", "true")
	d.MaxAge = time.Nanosecond
	st, _, err := m.Build(bg, d, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	<-f.closed // the first builder
	old := st.Rec.Checkpoint
	res, err := m.Sandbox(bg, nil, "aged", Overrides{})
	if err != nil || res.Sandbox.FromCheckpoint != old {
		t.Fatalf("hand-over while stale: %+v, %v; want one from the old snapshot", res, err)
	}
	<-f.closed // the rebuild's builder: closed after the rebuild recorded its snapshot
	if st, _ := m.Get(bg, "aged"); st.Rec.Checkpoint == old || st.Rec.State != store.EnvReady {
		t.Errorf("after the background rebuild: %s %s, want ready with a new snapshot", st.Rec.State, st.Rec.Checkpoint)
	}
}

func TestCloseStopsABuildInFlight(t *testing.T) {
	f, m := newFake(t)
	entered := make(chan struct{}, 1)
	sawCancel := make(chan struct{}, 2)
	f.onExec = func(ctx context.Context, shell string) (int, error) {
		if shell != "forever" {
			return 0, nil
		}
		entered <- struct{}{}
		<-ctx.Done()
		sawCancel <- struct{}{}
		return 0, ctx.Err()
	}
	errc := make(chan error, 1)
	go func() {
		_, _, err := m.Build(bg, def("closing", "forever"), false, nil)
		errc <- err
	}()
	<-entered
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	<-sawCancel // Close returned only after the build saw its context end
	if err := <-errc; err == nil {
		t.Fatal("a build stopped by Close: got no error")
	}
	st, err := m.Get(bg, "closing")
	if err != nil || st.Rec.State != store.EnvFailed {
		t.Errorf("record of a stopped build: %+v, %v; want failed", st, err)
	}
	if len(f.live(t)) != 0 {
		t.Errorf("the builder of a stopped build is still live")
	}
	if _, _, err := m.Build(bg, def("after", "true"), false, nil); !errdefs.IsUnavailable(err) {
		t.Errorf("a build after Close: got %v, want Unavailable", err)
	}
}

func TestLeaseWaitersShareTheClientsBuild(t *testing.T) {
	f, m := newFake(t)
	d := def("lease", "client-side")
	st, builder, id, err := m.BeginBuild(bg, d)
	if err != nil || st != nil || builder == nil || id == "" {
		t.Fatalf("first caller: %v %v %q %v; want a builder and a lease", st, builder, id, err)
	}
	type result struct {
		st      *Status
		builder bool
		err     error
	}
	waiter := make(chan result, 1)
	go func() {
		st, b, _, err := m.BeginBuild(bg, d)
		waiter <- result{st, b != nil, err}
	}()
	got, err := m.CompleteBuild(bg, id, true, "")
	if err != nil || got.Rec.State != store.EnvReady {
		t.Fatalf("complete: %+v, %v", got, err)
	}
	r := <-waiter
	if r.err != nil || r.builder || r.st == nil || r.st.Rec.Checkpoint != got.Rec.Checkpoint {
		t.Errorf("waiter: %+v; want the client's build", r)
	}
	if len(f.builders) != 1 {
		t.Errorf("got %d builders, want 1", len(f.builders))
	}
	if _, err := m.CompleteBuild(bg, id, true, ""); !errdefs.IsNotFound(err) {
		t.Errorf("a lease completed twice: got %v, want NotFound", err)
	}
}

// A caller that looked at the record while a lease's build was finishing,
// and asks for a lease once that build's flight is over, gets none: the
// hash is built (a CI run saw it start a second builder).
func TestNoLeaseForABuiltHash(t *testing.T) {
	f, m := newFake(t)
	d := def("lease", "client-side")
	_, _, id, err := m.BeginBuild(bg, d)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.CompleteBuild(bg, id, true, ""); err != nil {
		t.Fatal(err)
	}
	rec, err := m.store.GetEnvironment(bg, d.Name)
	if err != nil {
		t.Fatal(err)
	}
	// What BeginBuild's flight runs, for a caller whose look at the record
	// came before the build ended.
	mine := make(chan *lease, 1)
	done := make(chan error, 1)
	go func() { done <- m.holdLease(bg, d, rec.Hash, mine) }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("holdLease of a built hash: %v, want nil (look again)", err)
		}
	case l := <-mine:
		t.Errorf("holdLease of a built hash handed out a lease")
		l.result <- nil // let it end
		<-done
	}
	if len(f.builders) != 1 {
		t.Errorf("got %d builders, want 1", len(f.builders))
	}
}

func TestFailedLeaseLetsTheNextCallerBuild(t *testing.T) {
	f, m := newFake(t)
	d := def("lease-fail", "client-side")
	_, _, id, err := m.BeginBuild(bg, d)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.CompleteBuild(bg, id, false, "npm install failed"); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("failed setup: got %v, want FailedPrecondition", err)
	}
	_, builder, id2, err := m.BeginBuild(bg, d)
	if err != nil || builder == nil || id2 == id {
		t.Fatalf("next caller: %v %q %v; want a lease of its own", builder, id2, err)
	}
	m.Close() // ends the held lease and closes its builder
	if len(f.live(t)) != 0 {
		t.Errorf("a builder outlived Close")
	}
	if _, err := m.CompleteBuild(bg, id2, true, ""); !errdefs.IsNotFound(err) {
		t.Errorf("a lease ended by Close: got %v, want NotFound", err)
	}
}

func TestCancelledLeaseCallerLeavesTheHashFree(t *testing.T) {
	f, m := newFake(t)
	ctx, cancel := context.WithCancel(bg)
	f.onBuilder = func(context.Context) error {
		cancel() // the client goes away while its builder starts
		f.onBuilder = nil
		return context.Canceled
	}
	if _, _, _, err := m.BeginBuild(ctx, def("gone", "x")); !errors.Is(err, context.Canceled) {
		t.Errorf("got %v, want context.Canceled", err)
	}
	// The hash is free again: the next caller gets a lease at once.
	if _, b, _, err := m.BeginBuild(bg, def("gone", "x")); err != nil || b == nil {
		t.Errorf("next caller: %v, %v", b, err)
	}
}

func TestCloseStopsARefillInFlight(t *testing.T) {
	f, m := newFake(t)
	blocked, sawCancel := make(chan struct{}, 1), make(chan struct{}, 1)
	f.onStart = func(ctx context.Context, pool string) error {
		blocked <- struct{}{}
		<-ctx.Done()
		sawCancel <- struct{}{}
		return ctx.Err()
	}
	d := def("refill", "true")
	d.PoolSize = 1
	if _, _, err := m.Build(bg, d, false, nil); err != nil {
		t.Fatal(err)
	}
	<-blocked
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-sawCancel:
	default:
		t.Fatal("Close returned before the refill it cancelled ended")
	}
}

func TestHandoverThatBuiltSchedulesNoRebuild(t *testing.T) {
	f, m := newFake(t)
	d := def("fresh", "true")
	d.MaxAge = time.Nanosecond // older than its max age as soon as it is built
	res, err := m.Sandbox(bg, &d, "", Overrides{})
	if err != nil || !res.Built {
		t.Fatalf("got %+v, %v; want a hand-over that built", res, err)
	}
	m.Close() // waits for a rebuild, had one been scheduled
	if len(f.builders) != 1 {
		t.Errorf("got %d builders, want 1: the call that built its snapshot scheduled a rebuild", len(f.builders))
	}
}
