package main

import (
	"fmt"
	"io"
)

// print writes section 5.
func (e *EnvResult) print(w io.Writer) {
	fmt.Fprintf(w, "5. environments on %s: setup = one shell step, %d × (write 32 KB of random bytes + sha256sum), calibrated for %.1f s\n",
		e.Runtime, e.Iterations, e.NominalSetupS)
	fmt.Fprintf(w, "   measured setup exec (the %d fresh runs): %s ms; task = check the setup's files\n", e.Setup.N, pp(e.Setup))
	fmt.Fprintln(w, "mode\truns\ttotal s\tper run p50 / p95\ttotal/one setup\t")
	fmt.Fprintf(w, "(a) fresh: create + setup + task + close, sequential\t%d\t%.1f\t%s\t%.2fx\t\n",
		e.Runs, e.FreshTotalMS/1000, pp(e.FreshRun), ratio(e.FreshTotalMS, e.Setup.Median))
	fmt.Fprintf(w, "(b) build once (%.1f s; first call %.1f s), then env.Sandbox + task + close\t%d\t%.1f\t%s\t%.2fx\t\n",
		e.BuildMS/1000, e.BuildCallMS/1000, e.Runs, e.ForkTotalMS/1000, pp(e.ForkRun), e.ForkOverOne)
	fmt.Fprintf(w, "(b2) the same, the runs after the build %d at a time\t%d\t%.1f\t\t%.2fx\t\n",
		envParallel, e.Runs, e.ConcTotalMS/1000, e.ConcOverOne)
	fmt.Fprintf(w, "(a)/(b)\t\t%.1fx\t\t\t\n", e.FreshOverFork)
	fmt.Fprintln(w)
	fmt.Fprintf(w, "   (c) warm pool of %d: hand-overs from a full pool (n=%d; %d not from the pool, skipped)\n",
		e.PoolSize, e.HandoverDaemon.N, e.SkippedNotPool)
	fmt.Fprintln(w, "what\tp50 / p95 ms\t")
	fmt.Fprintf(w, "hand-over, daemon-side (HandoverMS)\t%s\t\n", pp(e.HandoverDaemon))
	fmt.Fprintf(w, "hand-over, client call (env.Sandbox)\t%s\t\n", pp(e.HandoverClient))
	fmt.Fprintf(w, "refill to %d before each sample\t%s\t\n", e.PoolSize, pp(e.RefillWait))
	fmt.Fprintln(w)
}
