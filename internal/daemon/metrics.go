package daemon

import (
	"context"
	"fmt"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/cgroups"
	"github.com/forkbox/forkbox/internal/store"
)

// Metrics is one reading of a sandbox's usage counters (GetSandboxMetrics,
// `forkbox stats`). CPU, memory and pids come from the sandbox's cgroup
// (package cgroups, as the Prometheus collector reads them), disk from its
// writable layer (snapshot.Snapshotter.Charged), network from its veth.
//
// Under gVisor the host cgroup holds the runtime that runs the sandbox (the
// sentry and the gofer), not the sandbox's processes: CPU is the sentry's,
// which does the sandbox's work and its own; memory is what the sentry
// holds, the sandbox's memory included; pids counts the runtime's host
// threads. Under crun all three are the sandbox's processes' own. Disk and
// network mean the same under both.
type Metrics struct {
	Sandbox *store.Sandbox
	Time    time.Time
	// CPUSeconds is the CPU time used since the sandbox started; CPULimit
	// its limit in cores (0: none).
	CPUSeconds float64
	CPULimit   float64
	// MemoryBytes is the memory charged to the cgroup, MemoryLimit its
	// limit (0: none).
	MemoryBytes, MemoryLimit int64
	// DiskBytes is what the writable layer holds of its own (what the disk
	// limit counts), DiskLimit the limit (0: none).
	DiskBytes, DiskLimit int64
	// NetRxBytes and NetTxBytes are received and sent, from the sandbox's
	// side, since it started or last woke (its veth pair is new then).
	NetRxBytes, NetTxBytes uint64
	// Pids is the number of tasks in the cgroup, PidsLimit its limit.
	Pids, PidsLimit int64
	// Unavailable names the counters that could not be read, with why.
	Unavailable map[string]string
}

// metricsStates are the states whose sandboxes have a cgroup, a writable
// layer and a veth to read.
var metricsStates = map[store.State]bool{store.StateRunning: true, store.StatePaused: true, store.StateDegraded: true}

// chargedTimeout bounds the disk reading of one sandbox (where the
// snapshotter walks the layer, it can be slow).
const chargedTimeout = 2 * time.Second

// SandboxMetrics reads the counters of one sandbox (by ID or name), or of
// every live one when idOrName is "". A named sandbox that is not running,
// paused or degraded is a FailedPrecondition.
func (d *Daemon) SandboxMetrics(ctx context.Context, idOrName string) ([]Metrics, error) {
	var list []*store.Sandbox
	if idOrName != "" {
		sb, err := d.store.GetSandbox(ctx, idOrName)
		if err != nil {
			return nil, err
		}
		if !metricsStates[sb.State] {
			return nil, fmt.Errorf("sandbox %s is %s: metrics need a running, paused or degraded sandbox: %w", sb.ID, sb.State, errdefs.ErrFailedPrecondition)
		}
		list = []*store.Sandbox{sb}
	} else {
		all, err := d.store.ListSandboxes(ctx, false)
		if err != nil {
			return nil, err
		}
		for _, sb := range all {
			if metricsStates[sb.State] && sb.Pool == "" {
				list = append(list, sb)
			}
		}
	}
	out := make([]Metrics, 0, len(list))
	for _, sb := range list {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		out = append(out, d.readMetrics(ctx, sb))
	}
	return out, nil
}

func (d *Daemon) readMetrics(ctx context.Context, sb *store.Sandbox) Metrics {
	m := Metrics{Sandbox: sb, Time: time.Now(), CPULimit: sb.Config.CPU, DiskLimit: d.diskLimit(sb.Config)}
	miss := func(what string, err error) {
		if m.Unavailable == nil {
			m.Unavailable = map[string]string{}
		}
		m.Unavailable[what] = err.Error()
	}
	cg := d.cgroupPath(sb.ID)
	if n, err := cgroups.CPUNanos(d.cgroupRoot, cg); err == nil {
		m.CPUSeconds = float64(n) / 1e9
	} else {
		miss("cpu", err)
	}
	if n, limit, err := cgroups.Memory(d.cgroupRoot, cg); err == nil {
		m.MemoryBytes, m.MemoryLimit = n, limit
	} else {
		miss("memory", err)
	}
	if m.MemoryLimit == 0 {
		m.MemoryLimit = sb.Config.MemoryBytes
	}
	if n, limit, err := cgroups.Pids(d.cgroupRoot, cg); err == nil {
		m.Pids, m.PidsLimit = n, limit
	} else {
		miss("pids", err)
	}
	if m.PidsLimit == 0 {
		m.PidsLimit = sb.Config.Pids
	}
	dctx, cancel := context.WithTimeout(ctx, chargedTimeout)
	if n, err := d.snaps.Charged(dctx, sb.ID); err == nil {
		m.DiskBytes = n
	} else {
		miss("disk", err)
	}
	cancel()
	if c, err := d.net.Counters(ctx, sb.ID); err == nil {
		m.NetRxBytes, m.NetTxBytes = c.RxBytes, c.TxBytes
	} else {
		miss("net", err)
	}
	return m
}
