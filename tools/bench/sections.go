package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
)

// measureAll runs the sections asked for, in order, into rep.
func (b *bench) measureAll(ctx context.Context, rep *Report, rootfs, dir string) error {
	o := b.opts
	var floor Summary
	if o.singleHost() && (len(o.sections) > 1 || !o.sections["density"]) { // the floor is the start section's yardstick
		progress("raw floor: %d namespaced starts of /bin/true", o.floorReps)
		var err error
		if floor, err = measureFloor(ctx, rootfs, o.floorReps); err != nil {
			return err
		}
		rep.Floor = floor
	}
	for _, rt := range o.runtimes {
		if !o.sections["start"] {
			break
		}
		progress("%s: %d creates, %d execs", rt, o.reps, o.execReps)
		r, err := b.measureRuntime(ctx, rt)
		if err != nil {
			return err
		}
		r.CreateOverFloor = ratio(r.CreateFirstExec.Median, floor.Median)
		r.ExecOverFloor = ratio(r.ExecTrue.Median, floor.Median)
		rep.Runtimes = append(rep.Runtimes, r)
	}
	for _, rt := range o.runtimes {
		if !o.sections["profile"] || b.stateDir == "" {
			break
		}
		progress("%s: where an exec of true goes, %d interleaved rounds", rt, o.execReps)
		r, err := b.measureProfile(ctx, rt)
		if err != nil {
			return err
		}
		rep.Profiles = append(rep.Profiles, r)
	}
	for _, s := range o.sizes {
		if !o.sections["fork"] {
			break
		}
		size, _ := parseSize(s)
		for _, rt := range o.runtimes {
			progress("fork %s on %s", s, rt)
			r, err := b.measureFork(ctx, rt, size, s)
			if err != nil {
				return err
			}
			rep.Forks = append(rep.Forks, r)
		}
	}
	if o.fanout > 0 && o.sections["fanout"] {
		for _, rt := range o.runtimes {
			progress("fan-out: one fork of %d on %s", o.fanout, rt)
			r, err := b.measureFanout(ctx, rt)
			if err != nil {
				return err
			}
			rep.Fanouts = append(rep.Fanouts, r)
		}
	}
	for _, rt := range o.runtimes {
		if !o.sections["busy"] {
			break
		}
		progress("busy source capture on %s", rt)
		r, err := b.measureBusy(ctx, rt)
		if err != nil {
			return err
		}
		rep.Busy = append(rep.Busy, r)
	}
	if o.sections["env"] && len(o.runtimes) > 0 {
		rt := o.runtimes[0]
		progress("environments on %s: setup of about %s, %d runs, %d pool hand-overs", rt, o.envSetup, o.envRuns, o.envSamples)
		r, err := b.measureEnv(ctx, rt)
		if err != nil {
			return err
		}
		rep.Env = &r
	}
	if o.sections["e2b"] {
		if b.e2b == nil {
			progress("e2b: skipped (a --host daemon needs --e2b-url and --e2b-key)")
		} else {
			progress("e2b endpoint vs forkbox API: %d creates, %d runs, %d forks of %d", o.reps, o.execReps, o.reps, e2bForkCount)
			r, err := b.measureE2B(ctx, b.e2b)
			if err != nil {
				return err
			}
			rep.E2B = &r
		}
	}
	if o.sections["density"] {
		progress("density: free memory %.1f GiB; growing to %s gVisor sandboxes (budget %.1f GiB, leaving %.1f GiB free)",
			memAvailableGiB(), densityTargetText(o.densityCount), o.densityBudget, o.densityMinFree)
		r, err := b.measureDensity(ctx)
		if err != nil {
			return err
		}
		rep.Density = &r
	}
	if b.memorySection() {
		for _, s := range o.memSizes {
			size, _ := parseSize(s)
			progress("memory forks on gvisor: %s resident", s)
			r, err := b.measureMemory(ctx, s, size)
			if err != nil {
				return err
			}
			rep.Memory = append(rep.Memory, r)
		}
	}
	if o.peers && o.singleHost() {
		r, err := b.measurePeers(ctx, dir, filepath.Join(dir, benchArchive), benchImage)
		if err != nil {
			return err
		}
		r.setRatios(rep)
		rep.Peers = &r
	}
	if o.sections["cluster"] {
		progress("cluster: sources of %s on the 3-node test cluster, %d repetitions", strings.Join(o.clusterSizes, ", "), o.clusterReps)
		r, err := b.measureCluster(ctx, dir)
		rep.Cluster = r
		if err != nil {
			return err
		}
	}
	return nil
}

// maxSandboxes is the throwaway daemon's --max-sandboxes.
func (o options) maxSandboxes() int {
	if !o.sections["density"] {
		return benchMaxSandboxes
	}
	n := o.densityCount
	if n == 0 {
		n = densityDefault
	}
	// Room for the fork children and the control's creates, made while
	// every sandbox of the count (or session) still counts against it.
	extra := densityForks + 10 + densityControlCreates
	return max(benchMaxSandboxes, n+extra, o.densitySessions+extra)
}

func densityTargetText(n int) string {
	if n == 0 {
		return fmt.Sprintf("up to %d", densityDefault)
	}
	return strconv.Itoa(n)
}

// memorySection says whether the memory section runs: it is gVisor only.
func (b *bench) memorySection() bool {
	if !b.opts.sections["memory"] || len(b.opts.memSizes) == 0 {
		return false
	}
	for _, rt := range b.opts.runtimes {
		if rt == "gvisor" {
			return true
		}
	}
	return false
}
