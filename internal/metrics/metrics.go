// Package metrics owns the daemon's Prometheus metrics: what is measured at
// the API boundary (a Connect interceptor: calls, errors by class, latency of
// create/fork/exec/checkpoint, fork fan-out, pool hand-overs, environment
// builds) and what is read at scrape time (sandboxes by state from the
// store, each live sandbox's CPU and memory from its cgroup).
//
// Cardinality is bounded: procedure labels come from the API's fixed set,
// class labels from errdefs' fixed set, and per-sandbox series exist only
// while a sandbox is live, for at most MaxSandboxSeries sandboxes (the oldest
// first); forkbox_sandbox_series_dropped says how many were left out.
package metrics

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/forkbox/forkbox/internal/store"
)

// DefaultMaxSandboxSeries is how many sandboxes get CPU and memory series
// when Options.MaxSandboxSeries is 0.
const DefaultMaxSandboxSeries = 200

// Lister lists the live sandboxes; *store.Store is one.
type Lister interface {
	ListSandboxes(ctx context.Context, all bool) ([]*store.Sandbox, error)
}

// Options configures New.
type Options struct {
	// Sandboxes lists the live sandboxes at scrape time (nil: no sandbox
	// gauges and no per-sandbox series).
	Sandboxes Lister
	// CgroupParent is the cgroup under which sandboxes get theirs
	// ("/<parent>/<id>" in every hierarchy), as the daemon's --cgroup-parent.
	CgroupParent string
	// CgroupRoot is where the hierarchies are mounted (default /sys/fs/cgroup).
	CgroupRoot string
	// MaxSandboxSeries caps the sandboxes given CPU and memory series.
	MaxSandboxSeries int
	// Log receives scrape errors (default: discarded).
	Log *slog.Logger
	// Preboot reads the pre-booted sandbox pool at scrape time. Nil: no
	// pool series.
	Preboot func() PrebootCounts
	// RunscStandby reads gVisor's standby runsc processes at scrape time.
	// Nil: no standby series.
	RunscStandby func() StandbyCounts
}

// StandbyCounts are the standby runsc processes at a scrape: waiting, still
// to start (0: settled), and runsc commands that ran in one (Hits) or
// started runsc (Misses).
type StandbyCounts struct {
	Ready, Pending int
	Hits, Misses   int64
}

// PrebootCounts is the pre-booted sandbox pool at a scrape: members ready
// (of them, Created for memory-fork children), and creates or fork children
// that took one (Hits) or found none (Misses).
type PrebootCounts struct {
	Ready, Created int
	// Pending: members still to boot before the pool is full for the
	// keys asked for last (0: settled).
	Pending      int
	Hits, Misses int64
}

// Metrics is the daemon's registry and the collectors the interceptor feeds.
type Metrics struct {
	reg *prometheus.Registry

	requests   *prometheus.CounterVec
	errors     *prometheus.CounterVec
	latency    *prometheus.HistogramVec
	forkSize   prometheus.Histogram
	forkKids   *prometheus.CounterVec
	poolHits   prometheus.Counter
	poolMisses prometheus.Counter
	envBuilds  *prometheus.CounterVec
}

// Operations whose latency is measured.
var operations = map[string]string{
	"/forkbox.v1.SandboxService/CreateSandbox": "create",
	"/forkbox.v1.SandboxService/Fork":          "fork",
	"/forkbox.v1.SandboxService/Exec":          "exec",
	"/forkbox.v1.SandboxService/Checkpoint":    "checkpoint",
}

// New makes the registry with every forkbox collector, plus the Go runtime
// and process collectors.
func New(o Options) *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "forkbox_rpc_requests_total",
			Help: "API calls handled, by procedure (errors included).",
		}, []string{"procedure"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "forkbox_rpc_errors_total",
			Help: "API calls that failed, by procedure and error class (NotFound, InvalidArgument, ...).",
		}, []string{"procedure", "class"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "forkbox_operation_duration_seconds",
			Help: "Duration of successful create, fork, exec (the whole command) and checkpoint calls.",
			// 1 ms to about 150 s.
			Buckets: prometheus.ExponentialBuckets(0.001, 2.5, 14),
		}, []string{"operation"}),
		forkSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "forkbox_fork_children",
			Help:    "Fan-out of fork calls: children asked for per call.",
			Buckets: []float64{1, 2, 4, 8, 16, 32, 64, 100},
		}),
		forkKids: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "forkbox_fork_children_total",
			Help: "Fork children started (ok) or not (error), from the per-child results.",
		}, []string{"result"}),
		poolHits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "forkbox_pool_hits_total",
			Help: "Environment sandboxes handed over from a warm pool.",
		}),
		poolMisses: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "forkbox_pool_misses_total",
			Help: "Environment sandboxes not taken from a pool (forked or built on demand).",
		}),
		envBuilds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "forkbox_environment_builds_total",
			Help: "Environment builds run on behalf of an API call, by result (background rebuilds are not counted).",
		}, []string{"result"}),
	}
	for _, op := range operations {
		m.latency.WithLabelValues(op)
	}
	for _, r := range []string{"ok", "error"} {
		m.forkKids.WithLabelValues(r)
		m.envBuilds.WithLabelValues(r)
	}
	if o.CgroupRoot == "" {
		o.CgroupRoot = "/sys/fs/cgroup"
	}
	if o.MaxSandboxSeries <= 0 {
		o.MaxSandboxSeries = DefaultMaxSandboxSeries
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	m.reg.MustRegister(m.requests, m.errors, m.latency, m.forkSize, m.forkKids, m.poolHits, m.poolMisses, m.envBuilds,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if o.Sandboxes != nil {
		m.reg.MustRegister(&sandboxCollector{o: o})
	}
	if pre := o.Preboot; pre != nil {
		m.reg.MustRegister(
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "forkbox_preboot_ready",
				Help: "Pre-booted gVisor sandboxes ready to be handed out (serve --preboot)."},
				func() float64 { return float64(pre().Ready) }),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "forkbox_preboot_created_ready",
				Help: "Of forkbox_preboot_ready, those created for memory-fork children (booted, not started)."},
				func() float64 { return float64(pre().Created) }),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "forkbox_preboot_pending",
				Help: "Pre-booted sandboxes the pool still has to boot (the one booting included) to be full for the resources asked for last; 0 when it has settled."},
				func() float64 { return float64(pre().Pending) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "forkbox_preboot_hits_total",
				Help: "Creates and fork children that started in a pre-booted sandbox."},
				func() float64 { return float64(pre().Hits) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "forkbox_preboot_misses_total",
				Help: "gVisor creates and fork children that found no pre-booted sandbox of their resources and egress."},
				func() float64 { return float64(pre().Misses) }))
	}
	if sb := o.RunscStandby; sb != nil {
		m.reg.MustRegister(
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "forkbox_runsc_standby_ready",
				Help: "runsc processes started ahead and waiting for a command (serve --runsc-standby)."},
				func() float64 { return float64(sb().Ready) }),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "forkbox_runsc_standby_pending",
				Help: "Standby runsc processes still to start before every slot has one; 0 when settled."},
				func() float64 { return float64(sb().Pending) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "forkbox_runsc_standby_hits_total",
				Help: "gVisor runs, creates and restores that ran in a standby runsc."},
				func() float64 { return float64(sb().Hits) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "forkbox_runsc_standby_misses_total",
				Help: "gVisor runs, creates and restores that started runsc: no standby was ready or could take them."},
				func() float64 { return float64(sb().Misses) }))
	}
	return m
}

// Registry is the registry behind Handler (for tests and extra collectors).
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves the metrics in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Timeout: 10 * time.Second})
}
