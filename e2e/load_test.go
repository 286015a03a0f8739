package e2e

import (
	"context"
	"fmt"
	"math/rand"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/forkbox/forkbox/client"
)

// TestLoad runs many clients against one daemon: live sandboxes, execs and
// forks from concurrent clients, each with its own connection. It prints
// latency percentiles and asserts zero errors and zero leaks (no timing
// assertion: the figures are printed, not judged).
//
// Bounded form: 10 sandboxes, 300 execs, 30 forks, 20 clients.
// FORKBOX_RELIABILITY=full: 50 sandboxes, 5,000 execs, 500 forks.
func TestLoad(t *testing.T) {
	ctx := context.Background()
	nSandboxes := envInt(t, "FORKBOX_LOAD_SANDBOXES", scaled(10, 50))
	nExecs := envInt(t, "FORKBOX_LOAD_EXECS", scaled(300, 5000))
	nForks := envInt(t, "FORKBOX_LOAD_FORKS", scaled(30, 500))
	nClients := envInt(t, "FORKBOX_LOAD_CLIENTS", 20)
	closeAllLive(t)

	// The live sandboxes, half on each runtime, created by the clients.
	sbs := make([]*client.Sandbox, nSandboxes)
	var createLat latencies
	var wg sync.WaitGroup
	var errMu sync.Mutex
	var errs []string
	fail := func(format string, a ...any) {
		errMu.Lock()
		errs = append(errs, fmt.Sprintf(format, a...))
		errMu.Unlock()
	}
	sem := make(chan struct{}, nClients)
	for i := range sbs {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			o := clientOpts()
			o.Runtime = runtimes[i%len(runtimes)]
			start := time.Now()
			sb, err := (&client.Client{Socket: env.socket}).CreateSandbox(ctx, o)
			if err != nil {
				fail("create %d: %v", i, err)
				return
			}
			createLat.add(time.Since(start))
			sbs[i] = sb
		}(i)
	}
	wg.Wait()
	defer func() {
		for _, sb := range sbs {
			if sb != nil {
				sb.Close(ctx)
			}
		}
	}()
	if len(errs) > 0 {
		t.Fatalf("creating %d sandboxes: %d errors:\n  %s", nSandboxes, len(errs), strings.Join(errs, "\n  "))
	}

	// The work: nExecs execs and nForks forks (each child runs an exec and
	// is closed), spread over nClients clients, in a shuffled order.
	work := make([]bool, 0, nExecs+nForks) // true = fork
	for i := 0; i < nExecs; i++ {
		work = append(work, false)
	}
	for i := 0; i < nForks; i++ {
		work = append(work, true)
	}
	rng := rand.New(rand.NewSource(1))
	rng.Shuffle(len(work), func(i, j int) { work[i], work[j] = work[j], work[i] })
	var next atomic.Int64
	var execLat, forkLat, childExecLat, closeLat latencies
	start := time.Now()
	for c := 0; c < nClients; c++ {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			cl := &client.Client{Socket: env.socket}
			for {
				i := int(next.Add(1)) - 1
				if i >= len(work) {
					return
				}
				base, err := cl.Sandbox(ctx, sbs[i%len(sbs)].ID)
				if err != nil {
					fail("client %d: get: %v", c, err)
					continue
				}
				if !work[i] {
					var out strings.Builder
					t0 := time.Now()
					res, err := base.Exec(ctx, client.ExecOptions{Shell: fmt.Sprintf("echo %d", i), Stdout: &out})
					if err != nil || res.ExitCode != 0 || out.String() != fmt.Sprintf("%d\n", i) {
						fail("exec %d on %s (%s, %s): %v %+v %q [%s]", i, base.ID, base.Info.Runtime, base.Info.Ip, err, res, out.String(), cgroupCounters(base.ID))
						continue
					}
					execLat.add(time.Since(t0))
					continue
				}
				t0 := time.Now()
				child, err := base.ForkOne(ctx, "")
				if err != nil {
					fail("fork %d of %s: %v", i, base.ID, err)
					continue
				}
				forkLat.add(time.Since(t0))
				var out strings.Builder
				t1 := time.Now()
				res, err := child.Exec(ctx, client.ExecOptions{Shell: "hostname", Stdout: &out})
				if err != nil || res.ExitCode != 0 {
					fail("exec in child %s: %v %+v", child.ID, err, res)
				} else {
					childExecLat.add(time.Since(t1))
				}
				t2 := time.Now()
				if err := child.Close(ctx); err != nil {
					fail("close child %s: %v", child.ID, err)
					continue
				}
				closeLat.add(time.Since(t2))
			}
		}(c)
	}
	wg.Wait()
	total := time.Since(start)
	t.Logf("load: %d sandboxes (%s), %d execs and %d forks from %d clients in %s",
		nSandboxes, strings.Join(runtimes, "+"), nExecs, nForks, nClients, total.Round(time.Millisecond))
	for _, l := range []struct {
		name string
		l    *latencies
	}{{"create", &createLat}, {"exec", &execLat}, {"fork (1 child)", &forkLat}, {"exec in child", &childExecLat}, {"close child", &closeLat}} {
		t.Logf("load: %-15s %s", l.name, l.l.summary())
	}
	if len(errs) > 0 {
		t.Errorf("load: %d errors (want 0):\n  %s", len(errs), strings.Join(errs, "\n  "))
	}
	// Zero leaks: what the store calls live is, and nothing else is there.
	audit(t)
	for i, sb := range sbs {
		if err := sb.Close(ctx); err != nil {
			t.Errorf("close %s: %v", sb.ID, err)
		}
		sbs[i] = nil
	}
	closeAllLive(t)
}

// latencies collects durations from many goroutines.
type latencies struct {
	mu sync.Mutex
	d  []time.Duration
}

func (l *latencies) add(d time.Duration) { l.mu.Lock(); l.d = append(l.d, d); l.mu.Unlock() }

// summary is "n=N p50 p95 p99 max" in ms.
func (l *latencies) summary() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.d) == 0 {
		return "n=0"
	}
	d := append([]time.Duration(nil), l.d...)
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	p := func(q float64) string {
		return fmt.Sprintf("%.1f", float64(d[int(q*float64(len(d)-1))].Microseconds())/1000)
	}
	return fmt.Sprintf("n=%-5d p50 %s  p95 %s  p99 %s  max %s ms", len(d), p(0.50), p(0.95), p(0.99), p(1))
}
