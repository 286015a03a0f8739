package main

// The density section's steps on many sandboxes: creates one at a time,
// exec pairs on idle sandboxes, listing through pages, hibernating a few
// at a time.

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/forkbox/forkbox/client"
)

// createSeries times up to n creates (create makes one and returns its
// time), one at a time while more says so, each after the pre-boot pool
// has settled when paced (or back to back), and returns their times and
// how many took a pre-booted sandbox (-1: unknown). On an error it returns
// the times so far.
func (b *bench) createSeries(ctx context.Context, n int, paced bool, more func() bool, create func() (float64, error)) ([]float64, int, error) {
	var out []float64
	h0 := b.poolHits(ctx)
	for range n {
		if !more() {
			break
		}
		if paced {
			b.settlePool(ctx, densitySettle)
		}
		d, err := create()
		if err != nil {
			return out, 0, err
		}
		out = append(out, d)
	}
	h1 := b.poolHits(ctx)
	if h0 < 0 || h1 < 0 {
		return out, -1, nil
	}
	return out, int(h1 - h0), nil
}

// execIdle is how long a sandbox is left alone before execSpread times
// an exec on it: longer than the daemon's muxFreshFor (500 ms), after
// which it pings the agent's session before a call. With 21 sandboxes and
// execs picked at random, many would otherwise find the session fresh,
// and at 1,000 none: the two counts would time different calls.
const execIdle = time.Second

// execSpread runs n pairs of `true` execs, each pair in a sandbox picked at
// random from sbs among those idle for execIdle (waiting when none is): the
// first of a pair is the idle figure, the second, right after it, the hot one.
func (b *bench) execSpread(ctx context.Context, sbs []*client.Sandbox, n int) (idle, hot Summary, err error) {
	if len(sbs) == 0 {
		return Summary{}, Summary{}, nil
	}
	last := map[*client.Sandbox]time.Time{}
	var xs, hs []float64
	for range n {
		sb := sbs[rand.IntN(len(sbs))]
		if t, ok := last[sb]; ok && time.Since(t) < execIdle {
			// Not idle long enough: the one left alone longest, once it is.
			for _, c := range sbs {
				if last[c].Before(last[sb]) {
					sb = c
				}
			}
			time.Sleep(time.Until(last[sb].Add(execIdle)))
		}
		d, err := execTrue(ctx, sb)
		if err != nil {
			return Summary{}, Summary{}, err
		}
		h, err := execTrue(ctx, sb)
		if err != nil {
			return Summary{}, Summary{}, err
		}
		last[sb] = time.Now()
		xs, hs = append(xs, d), append(hs, h)
	}
	return summarize(xs), summarize(hs), nil
}

// listAll lists every live sandbox through pages of densityListPage.
func (b *bench) listAll(ctx context.Context) (n, pages int, err error) {
	o := client.ListOptions{PageSize: densityListPage}
	for {
		p, err := b.c.ListSandboxesPage(ctx, o)
		if err != nil {
			return 0, 0, fmt.Errorf("density: list: %w", err)
		}
		n, pages = n+len(p.Sandboxes), pages+1
		if p.NextPageToken == "" {
			return n, pages, nil
		}
		o.PageToken = p.NextPageToken
	}
}

// hibernateAll hibernates sbs a few at a time; it returns each call's time
// and the wall time (s).
func (b *bench) hibernateAll(ctx context.Context, sbs []*client.Sandbox) ([]float64, float64, error) {
	t := time.Now()
	var mu sync.Mutex
	var xs []float64
	var firstErr error
	sem := make(chan struct{}, densityParallel)
	var wg sync.WaitGroup
	for _, sb := range sbs {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			t0 := time.Now()
			err := sb.Hibernate(ctx)
			d := ms(time.Since(t0))
			mu.Lock()
			defer mu.Unlock()
			if err != nil && firstErr == nil {
				firstErr = fmt.Errorf("density: hibernate %s: %w", sb.ID, err)
			}
			xs = append(xs, d)
		}()
	}
	wg.Wait()
	return xs, time.Since(t).Seconds(), firstErr
}
