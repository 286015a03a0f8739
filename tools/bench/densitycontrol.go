package main

import (
	"context"
	"fmt"

	"github.com/forkbox/forkbox/client"
)

// DensityControl is the section's start measured again at its end, once
// every sandbox of the full count is hibernated (none of them live, their
// records kept): one create unmeasured, ten paced, ten back to back, and
// the exec pairs on those 21, as at the start. On a host whose own
// phases move these figures by as much as the count does (README,
// Density), the first ten came minutes before the full count and these
// minutes after it: a ratio that is high against both is the count's, one
// that is high against the first ten only was the host's drift.
//
// JSON (the "control" object of "density"):
//
//	create10, create_burst10        the paced and back-to-back creates (as create_first10, create_burst_first10)
//	pool_hits10, pool_hits_burst10  how many of each took a pre-booted sandbox (-1: unknown)
//	exec, exec_hot                  the exec pairs with the 21 live (as exec_at_10, exec_hot_at_10)
//	create_last10_over_control10    create_last10 p50 over create10 p50
//	exec_full_over_control          exec_at_full p50 over exec p50
//	exec_hot_full_over_control      exec_hot_at_full p50 over exec_hot p50
//	host_cpu                        the host's CPU use over a quiet window with the 21 live (as host_cpu_at_full)
type DensityControl struct {
	Create10      Summary `json:"create10"`
	Burst10       Summary `json:"create_burst10"`
	PoolHits10    int     `json:"pool_hits10"`
	PoolHitsBurst int     `json:"pool_hits_burst10"`
	Exec          Summary `json:"exec"`
	ExecHot       Summary `json:"exec_hot"`
	CreateRatio   float64 `json:"create_last10_over_control10"`
	ExecRatio     float64 `json:"exec_full_over_control"`
	ExecHotRatio  float64 `json:"exec_hot_full_over_control"`
	HostCPU       HostCPU `json:"host_cpu"`
}

// densityControlCreates is how many sandboxes the control makes.
const densityControlCreates = 1 + 2*densityEnd

// densityControl measures r.Control with create (the section's); the
// sandboxes it made are closed before it returns, so that the section's
// close-all still times the full count's.
func (b *bench) densityControl(ctx context.Context, r *DensityResult, create func() (*client.Sandbox, float64, error)) error {
	var made []*client.Sandbox
	defer func() { b.close(context.WithoutCancel(ctx), made...) }()
	ends := func(n int, paced bool) ([]float64, int, error) {
		return b.createSeries(ctx, n, paced, func() bool { return true }, func() (float64, error) {
			sb, d, err := create()
			if err != nil {
				return 0, fmt.Errorf("density control: create %d: %w", len(made)+1, err)
			}
			made = append(made, sb)
			return d, nil
		})
	}
	c := &r.Control
	if _, _, err := ends(1, false); err != nil { // unmeasured, as at the start
		return err
	}
	from := b.logSize()
	xs, hits, err := ends(densityEnd, true)
	if err != nil {
		return err
	}
	c.Create10, c.PoolHits10 = summarize(xs), hits
	r.CreatePhases.Control10 = b.daemonPhases(from, daemonCreatePhases, "")
	if xs, hits, err = ends(densityEnd, false); err != nil {
		return err
	}
	c.Burst10, c.PoolHitsBurst = summarize(xs), hits
	if b.cgroupParent != "" { // as at full count
		c.HostCPU = hostCPUOver(ctx, densityIdleWindow)
	}
	if c.Exec, c.ExecHot, err = b.execSpread(ctx, made, densityExecs); err != nil {
		return fmt.Errorf("density control: %w", err)
	}
	c.CreateRatio = ratio(r.CreateLast10.Median, c.Create10.Median)
	c.ExecRatio = ratio(r.ExecAtFull.Median, c.Exec.Median)
	c.ExecHotRatio = ratio(r.ExecHotAtFull.Median, c.ExecHot.Median)
	return nil
}
