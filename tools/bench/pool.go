package main

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// metricsClient reads the throwaway daemon's Prometheus metrics (its
// --metrics listener, behind the daemon's API token when it has one).
type metricsClient struct {
	url, token string
	hc         *http.Client
}

// values returns the first sample of each metric family by name (the
// pool's series have no labels).
func (m *metricsClient) values(ctx context.Context) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, m.url, nil)
	if err != nil {
		return nil, err
	}
	if m.token != "" {
		req.Header.Set("Authorization", "Bearer "+m.token)
	}
	resp, err := m.hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", m.url, resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", m.url, err)
	}
	out := map[string]float64{}
	for name, f := range fams {
		if len(f.GetMetric()) == 0 {
			continue
		}
		s := f.GetMetric()[0]
		switch {
		case s.GetGauge() != nil:
			out[name] = s.GetGauge().GetValue()
		case s.GetCounter() != nil:
			out[name] = s.GetCounter().GetValue()
		case s.GetUntyped() != nil:
			out[name] = s.GetUntyped().GetValue()
		}
	}
	return out, nil
}

// poolHits is the daemon's count of creates and fork children that took a
// pre-booted sandbox, or -1 when the bench cannot see it (--host, or
// no pool).
func (b *bench) poolHits(ctx context.Context) float64 {
	if b.metrics == nil {
		return -1
	}
	v, err := b.metrics.values(ctx)
	if err != nil {
		return -1
	}
	h, ok := v["forkbox_preboot_hits_total"]
	if !ok {
		return -1
	}
	return h
}

// settlePool waits (at most wait) until the daemon's pre-boot pool has
// nothing left to boot (forkbox_preboot_pending 0), so that a create
// measured next meets the pool in the same state whatever came before it.
// Without a pool, or with --host, it returns at once.
func (b *bench) settlePool(ctx context.Context, wait time.Duration) {
	if b.metrics == nil {
		return
	}
	deadline := time.Now().Add(wait)
	for ctx.Err() == nil && time.Now().Before(deadline) {
		v, err := b.metrics.values(ctx)
		if err != nil {
			return
		}
		if p, ok := v["forkbox_preboot_pending"]; !ok || p == 0 {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	progress("the pre-boot pool did not settle in %v; measuring anyway", wait)
}
