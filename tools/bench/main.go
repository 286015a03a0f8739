// Command bench measures forkbox on this host, in one run on one machine:
// sandbox create and exec per runtime against a raw namespaced-start floor,
// fork capture and fork-to-child-ready against the naive baseline (a fresh
// sandbox plus the same setup), a fan-out fork of many children, the
// capture of a CPU-busy source, and environments (a calibrated setup done
// fresh per run vs built once and forked per run, and warm-pool hand-overs),
// and memory forks on gVisor (memory checkpoint, per-child restore and a
// memory fan-out of sources holding resident memory, beside the filesystem
// fork of the same source). Every figure is a median and a p95 over
// repeated runs, never a single timing.
//
// Opt-in sections, not in the default run: density (how many sandboxes
// the host holds) and cluster (forks across the nodes of the 3-node test
// cluster vs on one node and on a single host, with the bytes each
// transfer ships; needs root and KUBEBUILDER_ASSETS; see cluster.go).
//
// By default it starts a throwaway daemon of its own (own state dir, socket,
// bridge, nftables table, veth prefix, subnet and cgroup parent) and removes
// everything at the end, on Ctrl-C too; --host uses a running daemon.
//
//	go run ./tools/bench [--quick] [--json] [--sizes 1MB,100MB,1GB] [--runtimes gvisor,crun]
//	go run ./tools/bench --sections env [--env-setup 10s] [--env-runs 10] [--env-samples 20]
//	go run ./tools/bench --sections memory [--mem-sizes 10MB,256MB,1GB] [--mem-reps 5] [--mem-fanout 10]
//	go run ./tools/bench --sections e2b [--reps 10] [--exec-reps 50]
//	KUBEBUILDER_ASSETS=/var/cache/forkbox/envtest go run ./tools/bench --sections fork,cluster [--cluster-sizes 100MB,1GB] [--cluster-reps 3]
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/cluster/clusterlab"
	"github.com/forkbox/forkbox/internal/testimage"
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
	binDir         string
	// cluster section
	clusterSizes   []string
	clusterReps    int
	clusterRuntime string
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
	fs.StringVar(&o.binDir, "bin-dir", "", "take forkbox and forkbox-agent from this directory (default bin/ when built, else a fresh build), e.g. an older build to compare with")
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
	fs.StringVar(&clusterSizes, "cluster-sizes", "100MB,1GB", "source sizes of the cluster section (written as the fork section writes them)")
	fs.IntVar(&o.clusterReps, "cluster-reps", 3, "repetitions of each cluster case per size (cluster section)")
	fs.StringVar(&o.clusterRuntime, "cluster-runtime", "crun", "runtime of the cluster section's sandboxes")
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
	if o.memReps < 1 || o.memFanout < 0 || o.memFanout > 100 {
		return o, fmt.Errorf("mem-reps must be >= 1 and mem-fanout 0..100: %w", errdefs.ErrInvalidArgument)
	}
	if o.sections["cluster"] && (o.clusterReps < 1 || o.clusterReps > 100 || len(o.clusterSizes) == 0) {
		return o, fmt.Errorf("cluster-reps must be 1..100 and cluster-sizes not empty: %w", errdefs.ErrInvalidArgument)
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

// progress goes to stderr, so that --json output stays clean.
func progress(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "[%s] %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, a...))
}

func main() {
	o, err := parseFlags(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func run(o options) (err error) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sigc := make(chan os.Signal, 2)
	signal.Notify(sigc, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigc)
	go func() {
		for range sigc { // keep catching: the cleanup must finish
			progress("interrupted: closing sandboxes and removing the throwaway daemon (wait)")
			cancel()
		}
	}()
	began := time.Now()
	if o.sections["cluster"] {
		if why := clusterlab.Missing(); why != "" {
			return fmt.Errorf("the cluster section: %s: %w", why, errdefs.ErrFailedPrecondition)
		}
	}
	if os.Geteuid() != 0 {
		return fmt.Errorf("the bench needs root (raw floor, throwaway daemon): %w", errdefs.ErrFailedPrecondition)
	}
	if err := testimage.Available(); err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "forkbox-bench-")
	if err != nil {
		return err
	}
	defer func() {
		if o.keep || (err != nil && ctx.Err() == nil) {
			fmt.Fprintln(os.Stderr, "bench: files kept in", dir)
			return
		}
		os.RemoveAll(dir)
	}()
	b := &bench{opts: o, live: map[string]*client.Sandbox{}}
	rep := &Report{Host: hostInfo(), Started: began}
	mem := startMemSampler()
	defer mem.stop()
	rootfs := ""
	if !o.singleHost() {
		rep.Daemon = "none (the cluster section runs its own cluster)"
	} else {
		var undo func()
		rootfs, undo, err = b.connect(ctx, rep, dir)
		defer undo()
		if err != nil {
			return err
		}
	}
	if err := b.measureAll(ctx, rep, rootfs, dir); err != nil {
		return err
	}
	rep.PeakUsedGiB, rep.BaseUsedGiB = mem.stop()
	rep.DurationS = time.Since(began).Seconds()
	rep.Targets = rep.targets()
	if o.json {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	rep.print(os.Stdout)
	return nil
}

// connect points b at the --host daemon or at a throwaway one, imports the
// bench image and unpacks the floor's rootfs below dir. undo closes what
// is left open and removes the throwaway daemon (call it also on error).
func (b *bench) connect(ctx context.Context, rep *Report, dir string) (rootfs string, undo func(), err error) {
	o := b.opts
	var undos []func()
	undo = func() {
		for i := len(undos) - 1; i >= 0; i-- {
			undos[i]()
		}
	}
	if o.host != "" {
		b.c = &client.Client{Token: o.token}
		if strings.HasPrefix(o.host, "unix://") {
			b.c.Socket = strings.TrimPrefix(o.host, "unix://")
		} else {
			b.c.URL = o.host
		}
		rep.Daemon = o.host
		if o.e2bURL != "" {
			b.e2b = &e2bClient{url: o.e2bURL, key: o.e2bKey, hc: &http.Client{}}
		}
	} else {
		progress("starting a throwaway daemon in %s", dir)
		d, err := startDaemon(ctx, dir, o.binDir, o.logLevel, o.maxSandboxes(), o.sections["e2b"])
		if d != nil {
			undos = append(undos, d.cleanup)
		}
		if err != nil {
			return "", undo, err
		}
		b.c = &client.Client{Socket: d.socket}
		b.daemonLog, b.stateDir = d.log.Name(), d.stateDir
		if d.e2bURL != "" {
			b.e2b = &e2bClient{url: d.e2bURL, key: d.e2bKey, hc: &http.Client{}}
		}
		if d.cmd != nil {
			b.daemonPID = d.cmd.Process.Pid
		}
		b.cgroupParent = d.names.cgroup
		rep.Daemon = "throwaway (" + d.socket + ")"
	}
	undos = append(undos, b.closeLeft)
	img, err := testimage.Busybox()
	if err != nil {
		return "", undo, err
	}
	archive := filepath.Join(dir, "busybox.tar")
	if err := testimage.WriteOCIArchive(img, "bench.local/busybox:latest", archive); err != nil {
		return "", undo, err
	}
	im, err := b.c.ImportImage(ctx, archive, "", nil)
	if err != nil {
		return "", undo, fmt.Errorf("import busybox: %w", err)
	}
	b.image = im.Name
	if b.memorySection() {
		progress("building the memory section's allocator")
		if b.memhog, err = buildMemhog(ctx, dir); err != nil {
			return "", undo, err
		}
	}
	rootfs = filepath.Join(dir, "rootfs")
	if err := unpackRootfs(img, rootfs); err != nil {
		return "", undo, fmt.Errorf("unpack rootfs for the floor: %w", err)
	}
	return rootfs, undo, nil
}

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
	return max(benchMaxSandboxes, n+densityForks+10)
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

func hostInfo() string {
	kernel, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	return fmt.Sprintf("%d CPUs, kernel %s, %s", runtime.NumCPU(), strings.TrimSpace(string(kernel)), memTotal())
}
