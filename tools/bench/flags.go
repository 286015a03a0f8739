package main

import (
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/forkbox/forkbox/errdefs"
)

type options struct {
	host, token  string
	sizes        []string
	runtimes     []string
	fanout       int
	reps         int
	execReps     int
	baselineReps int
	floorReps    int
	memory       string
	json, quick  bool
	keep         bool
	sections     map[string]bool
	logLevel     string
	envSetup     time.Duration
	envRuns      int
	envSamples   int
	memSizes     []string
	memReps      int
	memFanout    int
	// e2bURL and e2bKey reach a --host daemon's E2B endpoint; the throwaway
	// daemon serves one of its own.
	e2bURL, e2bKey string
	// density section
	densityCount   int
	densityMemory  string
	densityBudget  float64 // GiB
	densityMinFree float64 // GiB
	// densitySessions is how many sandboxes exist in all once the live
	// ones are hibernated (more made, each hibernated once up); 0: none
	// more. densityMinDisk is the free disk (GiB) it leaves.
	densitySessions int
	densityMinDisk  float64
	binDir          string
	// cluster section
	clusterSizes   []string
	clusterReps    int
	clusterRuntime string
	// peers section (--peers): podman with this OCI runtime
	peers        bool
	peerRuntime  string
	peerForkReps int
}

func parseFlags(args []string) (options, error) {
	var o options
	var sizes, runtimes, sections, memSizes, clusterSizes string
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.StringVar(&o.host, "host", "", "use this running daemon (unix:///path or http://host:port) instead of a throwaway one")
	fs.StringVar(&o.token, "token", os.Getenv("FORKBOX_TOKEN"), "bearer token for a TCP --host")
	fs.StringVar(&sizes, "sizes", "1MB,100MB,1GB", "fork source sizes (KB/MB/GB = 10^3/10^6/10^9 bytes, in 20 KB files)")
	fs.StringVar(&runtimes, "runtimes", "gvisor,crun", "runtimes to measure")
	fs.IntVar(&o.fanout, "fanout", 100, "children of the fan-out fork (0 skips it)")
	fs.IntVar(&o.reps, "reps", 10, "repetitions of creates, single-child forks and busy captures")
	fs.IntVar(&o.execReps, "exec-reps", 50, "exec round trips per runtime")
	fs.IntVar(&o.baselineReps, "baseline-reps", 3, "naive baseline repetitions (create + write) per size")
	fs.IntVar(&o.floorReps, "floor-reps", 50, "raw namespaced starts")
	fs.StringVar(&o.memory, "memory", "256Mi", "memory limit of every sandbox")
	fs.BoolVar(&o.quick, "quick", false, "smoke run: sizes 1MB,10MB, 3 reps, fan-out 10, env setup 2s x 3 runs, 5 hand-overs, memory 10MB x 3 reps, memory fan-out 3")
	fs.BoolVar(&o.json, "json", false, "print the results as JSON")
	fs.StringVar(&sections, "sections", "start,profile,fork,fanout,busy,env,memory,e2b", "sections to run")
	fs.StringVar(&o.e2bURL, "e2b-url", "", "the --host daemon's E2B endpoint (serve --e2b), for the e2b section")
	fs.StringVar(&o.e2bKey, "e2b-key", os.Getenv("E2B_API_KEY"), "its API key (the daemon's --api-token)")
	fs.StringVar(&o.binDir, "bin-dir", "", "take forkbox and forkbox-agent from this directory (default: a fresh build of this tree), e.g. an older build to compare with")
	fs.DurationVar(&o.envSetup, "env-setup", 10*time.Second, "environment setup work to calibrate for (env section)")
	fs.IntVar(&o.envRuns, "env-runs", 10, "runs of fresh setup vs build once and fork (env section)")
	fs.IntVar(&o.envSamples, "env-samples", 20, "warm-pool hand-over samples (env section)")
	fs.StringVar(&memSizes, "mem-sizes", "10MB,256MB,1GB", "resident memory of the memory section's sources (gVisor)")
	fs.IntVar(&o.memReps, "mem-reps", 5, "memory checkpoints, memory forks and filesystem forks per size (memory section)")
	fs.IntVar(&o.memFanout, "mem-fanout", 10, "children of the memory fan-out fork, when the host's memory holds them (0 skips it)")
	fs.IntVar(&o.densityCount, "density-count", 0, "live gVisor sandboxes the density section grows to (0: 1,000, or as many as the memory budget allows)")
	fs.StringVar(&o.densityMemory, "density-memory", "128Mi", "memory limit of each density sandbox")
	fs.Float64Var(&o.densityBudget, "density-budget", 8, "GiB of host memory the density sandboxes may use at most")
	fs.Float64Var(&o.densityMinFree, "density-min-free", 4, "GiB of MemAvailable the density section always leaves (it stops growing there)")
	fs.IntVar(&o.densitySessions, "density-sessions", 0, "sandboxes in all once the live ones are hibernated: more are made, each hibernated once up, and the wakes are measured among them (0: none more)")
	fs.Float64Var(&o.densityMinDisk, "density-min-disk", 5, "GiB of free disk under the daemon's state the sessions always leave (they stop there)")
	fs.StringVar(&clusterSizes, "cluster-sizes", "100MB,1GB", "source sizes of the cluster section (written as the fork section writes them)")
	fs.IntVar(&o.clusterReps, "cluster-reps", 3, "repetitions of each cluster case per size (cluster section)")
	fs.StringVar(&o.clusterRuntime, "cluster-runtime", "crun", "runtime of the cluster section's sandboxes")
	fs.BoolVar(&o.peers, "peers", false, "also measure podman with the same image and data (run + exec, exec, fork by commit + run) and print forkbox/podman ratios")
	fs.StringVar(&o.peerRuntime, "peer-runtime", "runc", "OCI runtime podman runs the peers with")
	fs.IntVar(&o.peerForkReps, "peer-fork-reps", 3, "forks by commit + run per size (peers)")
	fs.StringVar(&o.logLevel, "daemon-log-level", "info", "log level of the throwaway daemon (debug when the memory section runs)")
	fs.BoolVar(&o.keep, "keep", false, "keep the throwaway daemon's directory (logs) after the run")
	if err := fs.Parse(args); err != nil {
		return o, fmt.Errorf("%v: %w", err, errdefs.ErrInvalidArgument)
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if !set["daemon-log-level"] && (strings.Contains(sections, "memory") || strings.Contains(sections, "profile")) {
		// The memory section reads the child's `runsc restore` time from
		// the daemon's debug log, the profile section its exec phases.
		o.logLevel = "debug"
	}
	if o.quick {
		if !set["sizes"] {
			sizes = "1MB,10MB"
		}
		if !set["reps"] {
			o.reps = 3
		}
		if !set["exec-reps"] {
			o.execReps = 10
		}
		if !set["baseline-reps"] {
			o.baselineReps = 1
		}
		if !set["fanout"] {
			o.fanout = 10
		}
		if !set["floor-reps"] {
			o.floorReps = 10
		}
		if !set["env-setup"] {
			o.envSetup = 2 * time.Second
		}
		if !set["env-runs"] {
			o.envRuns = 3
		}
		if !set["env-samples"] {
			o.envSamples = 5
		}
		if !set["mem-sizes"] {
			memSizes = "10MB"
		}
		if !set["mem-reps"] {
			o.memReps = 3
		}
		if !set["mem-fanout"] {
			o.memFanout = 3
		}
		if !set["cluster-sizes"] {
			clusterSizes = "10MB"
		}
		if !set["cluster-reps"] {
			o.clusterReps = 2
		}
	}
	o.sizes = splitList(sizes)
	o.runtimes = splitList(runtimes)
	o.memSizes = splitList(memSizes)
	o.clusterSizes = splitList(clusterSizes)
	o.sections = map[string]bool{}
	for _, x := range splitList(sections) {
		if !knownSections[x] {
			return o, fmt.Errorf("section %q: want start, profile, fork, fanout, busy, env, memory, e2b, density or cluster: %w", x, errdefs.ErrInvalidArgument)
		}
		o.sections[x] = true
	}
	for _, s := range slices.Concat(o.sizes, o.memSizes, o.clusterSizes) {
		if _, err := parseSize(s); err != nil {
			return o, err
		}
	}
	for _, rt := range append(slices.Clone(o.runtimes), o.clusterRuntime) {
		if rt != "gvisor" && rt != "crun" {
			return o, fmt.Errorf("runtime %q: want gvisor or crun: %w", rt, errdefs.ErrInvalidArgument)
		}
	}
	if o.reps < 1 || o.execReps < 1 || o.baselineReps < 1 || o.floorReps < 1 || o.fanout < 0 || o.fanout > 100 {
		return o, fmt.Errorf("reps must be >= 1 and fanout 0..100: %w", errdefs.ErrInvalidArgument)
	}
	if o.densityCount < 0 || o.densityCount > 100_000 || o.densityBudget <= 0 || o.densityMinFree < 0 {
		return o, fmt.Errorf("density-count must be 0..100000, density-budget > 0 and density-min-free >= 0: %w", errdefs.ErrInvalidArgument)
	}
	if o.densitySessions < 0 || o.densitySessions > 60_000 || o.densityMinDisk < 0 {
		return o, fmt.Errorf("density-sessions must be 0..60000 (a /16 of addresses) and density-min-disk >= 0: %w", errdefs.ErrInvalidArgument)
	}
	if o.memReps < 1 || o.memFanout < 0 || o.memFanout > 100 {
		return o, fmt.Errorf("mem-reps must be >= 1 and mem-fanout 0..100: %w", errdefs.ErrInvalidArgument)
	}
	if o.sections["cluster"] && (o.clusterReps < 1 || o.clusterReps > 100 || len(o.clusterSizes) == 0) {
		return o, fmt.Errorf("cluster-reps must be 1..100 and cluster-sizes not empty: %w", errdefs.ErrInvalidArgument)
	}
	if o.peers && (o.peerForkReps < 1 || o.peerForkReps > 100 || (o.peerRuntime != "runc" && o.peerRuntime != "crun")) {
		return o, fmt.Errorf("peer-fork-reps must be 1..100 and peer-runtime runc or crun: %w", errdefs.ErrInvalidArgument)
	}
	if o.envRuns < 2 || o.envSamples < 1 || o.envSetup < 100*time.Millisecond {
		return o, fmt.Errorf("env-runs must be >= 2, env-samples >= 1 and env-setup >= 100ms: %w", errdefs.ErrInvalidArgument)
	}
	return o, nil
}

var knownSections = map[string]bool{"start": true, "profile": true, "fork": true, "fanout": true, "busy": true, "env": true, "memory": true, "e2b": true, "density": true, "cluster": true}

// singleHost says whether a section runs that measures the throwaway (or
// --host) daemon: all but cluster, which starts its own cluster.
func (o options) singleHost() bool {
	for x := range o.sections {
		if x != "cluster" {
			return true
		}
	}
	return false
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// parseSize parses "1MB", "100MB", "1GB", "20KB" or bytes (decimal units).
func parseSize(s string) (int64, error) {
	u := strings.ToUpper(strings.TrimSpace(s))
	mult := int64(1)
	for _, x := range []struct {
		suffix string
		m      int64
	}{{"GB", 1e9}, {"MB", 1e6}, {"KB", 1e3}, {"B", 1}} {
		if strings.HasSuffix(u, x.suffix) {
			u, mult = strings.TrimSuffix(u, x.suffix), x.m
			break
		}
	}
	n, err := strconv.ParseInt(u, 10, 64)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("size %q: want e.g. 1MB, 100MB, 1GB: %w", s, errdefs.ErrInvalidArgument)
	}
	return n * mult, nil
}
