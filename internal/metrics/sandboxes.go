package metrics

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/forkbox/forkbox/internal/cgroups"
	"github.com/forkbox/forkbox/internal/store"
)

// states are the live states reported even at zero, so that a dashboard
// sees a series drop to 0 instead of vanishing.
var states = []store.State{store.StateCreating, store.StateRunning, store.StatePaused, store.StateHibernating,
	store.StateHibernated, store.StateDegraded, store.StateFailed, store.StateClosing}

var (
	descSandboxes = prometheus.NewDesc("forkbox_sandboxes",
		"Live sandboxes by state (warm-pool sandboxes included).", []string{"state"}, nil)
	descPooled = prometheus.NewDesc("forkbox_pool_sandboxes",
		"Sandboxes waiting in environment warm pools.", nil, nil)
	descCPU = prometheus.NewDesc("forkbox_sandbox_cpu_seconds_total",
		"CPU time used by a live sandbox's cgroup (series exist only while the sandbox lives; capped).", []string{"sandbox"}, nil)
	descMem = prometheus.NewDesc("forkbox_sandbox_memory_bytes",
		"Memory charged to a live sandbox's cgroup (series exist only while the sandbox lives; capped).", []string{"sandbox"}, nil)
	descDropped = prometheus.NewDesc("forkbox_sandbox_series_dropped",
		"Live sandboxes left without CPU and memory series because of the cap.", nil, nil)
	descScrapeErr = prometheus.NewDesc("forkbox_scrape_error",
		"1 if the sandbox list could not be read in this scrape.", nil, nil)
)

// sandboxCollector reads the store and the cgroups at scrape time.
type sandboxCollector struct{ o Options }

func (c *sandboxCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descSandboxes, descPooled, descCPU, descMem, descDropped, descScrapeErr} {
		ch <- d
	}
}

func (c *sandboxCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	list, err := c.o.Sandboxes.ListSandboxes(ctx, false)
	if err != nil {
		c.o.Log.Warn("metrics: list sandboxes", "err", err)
		ch <- prometheus.MustNewConstMetric(descScrapeErr, prometheus.GaugeValue, 1)
		return
	}
	ch <- prometheus.MustNewConstMetric(descScrapeErr, prometheus.GaugeValue, 0)
	counts := map[store.State]int{}
	pooled := 0
	for _, sb := range list {
		counts[sb.State]++
		if sb.Pool != "" {
			pooled++
		}
	}
	for _, st := range states {
		ch <- prometheus.MustNewConstMetric(descSandboxes, prometheus.GaugeValue, float64(counts[st]), string(st))
	}
	ch <- prometheus.MustNewConstMetric(descPooled, prometheus.GaugeValue, float64(pooled))

	// The oldest live sandboxes keep their series; the rest are counted.
	var live []*store.Sandbox
	for _, sb := range list {
		if sb.State == store.StateRunning || sb.State == store.StatePaused || sb.State == store.StateDegraded {
			live = append(live, sb)
		}
	}
	slices.SortFunc(live, func(a, b *store.Sandbox) int {
		if n := a.CreatedAt.Compare(b.CreatedAt); n != 0 {
			return n
		}
		return strings.Compare(a.ID, b.ID)
	})
	dropped := 0
	if len(live) > c.o.MaxSandboxSeries {
		dropped = len(live) - c.o.MaxSandboxSeries
		live = live[:c.o.MaxSandboxSeries]
	}
	ch <- prometheus.MustNewConstMetric(descDropped, prometheus.GaugeValue, float64(dropped))
	for _, sb := range live {
		path := "/" + strings.Trim(c.o.CgroupParent, "/") + "/" + sb.ID
		if cpu, ok := cpuSeconds(c.o.CgroupRoot, path); ok {
			ch <- prometheus.MustNewConstMetric(descCPU, prometheus.CounterValue, cpu, sb.ID)
		}
		if mem, ok := memoryBytes(c.o.CgroupRoot, path); ok {
			ch <- prometheus.MustNewConstMetric(descMem, prometheus.GaugeValue, mem, sb.ID)
		}
	}
}

// cpuSeconds and memoryBytes read a cgroup's counters through package
// cgroups, which GetSandboxMetrics shares.
func cpuSeconds(root, path string) (float64, bool) {
	n, err := cgroups.CPUNanos(root, path)
	return float64(n) / 1e9, err == nil
}

func memoryBytes(root, path string) (float64, bool) {
	n, _, err := cgroups.Memory(root, path)
	return float64(n), err == nil
}
