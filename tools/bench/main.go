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
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/cluster/clusterlab"
	"github.com/forkbox/forkbox/internal/testimage"
)

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
	if o.peers {
		if why := peerMissing(o.peerRuntime); why != "" {
			return fmt.Errorf("--peers: %s: %w", why, errdefs.ErrFailedPrecondition)
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
		b.metrics = &metricsClient{url: d.metricsURL, token: d.e2bKey, hc: &http.Client{Timeout: 30 * time.Second}}
		b.cgroupParent = d.names.cgroup
		rep.Daemon = "throwaway (" + d.socket + ")"
	}
	undos = append(undos, b.closeLeft)
	img, err := testimage.Busybox()
	if err != nil {
		return "", undo, err
	}
	archive := filepath.Join(dir, benchArchive)
	if err := testimage.WriteOCIArchive(img, benchImage, archive); err != nil {
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
	if b.opts.sections["profile"] {
		progress("building the profile section's spawn floor")
		if b.spawnFloor, err = buildSpawnFloor(ctx, dir); err != nil {
			return "", undo, err
		}
	}
	rootfs = filepath.Join(dir, "rootfs")
	if err := unpackRootfs(img, rootfs); err != nil {
		return "", undo, fmt.Errorf("unpack rootfs for the floor: %w", err)
	}
	return rootfs, undo, nil
}

// The bench image: busybox, written as an OCI archive into the run's
// directory and imported (into the daemon, and into podman for --peers).
const (
	benchImage   = "bench.local/busybox:latest"
	benchArchive = "busybox.tar"
)

func hostInfo() string {
	kernel, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	info := fmt.Sprintf("%d CPUs, kernel %s, %s", runtime.NumCPU(), strings.TrimSpace(string(kernel)), memTotal())
	// Whether anonymous memory gets huge pages moves gVisor's start and
	// restore (README, Notes for this kind of host): runs are comparable
	// only with the same mode.
	if thp, err := os.ReadFile("/sys/kernel/mm/transparent_hugepage/enabled"); err == nil {
		if mode := selectedMode(string(thp)); mode != "" {
			info += ", transparent huge pages " + mode
		}
	}
	return info
}

// selectedMode returns the bracketed choice of a sysfs mode list such as
// "always [madvise] never", or "" if none is.
func selectedMode(list string) string {
	_, rest, ok := strings.Cut(list, "[")
	if !ok {
		return ""
	}
	mode, _, ok := strings.Cut(rest, "]")
	if !ok {
		return ""
	}
	return mode
}
