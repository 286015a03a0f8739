package daemon

import (
	"context"
	"net/netip"

	"github.com/forkbox/forkbox/internal/cgroups"
	"github.com/forkbox/forkbox/internal/mount"
	"github.com/forkbox/forkbox/internal/network"
	"github.com/forkbox/forkbox/internal/runtime"
	"github.com/forkbox/forkbox/internal/snapshot"
)

// The daemon's engine logic reaches the host through a few narrow parts,
// so that it can be tested without root: New opens the real ones; unit tests
// give fakes (and the naive snapshotter) to open.

// netManager is the sandbox network as the daemon uses it: a
// *network.Manager.
type netManager interface {
	// AllocateFunc returns a free address after last (wrapping around),
	// asking taken about each candidate.
	AllocateFunc(last netip.Addr, taken network.Taken) (netip.Addr, error)
	Setup(ctx context.Context, id string, ip netip.Addr, pol network.Policy) (*network.Network, error)
	SetPolicy(ctx context.Context, id string, ip netip.Addr, pol network.Policy) error
	Reconfigure(ctx context.Context, id string, ip netip.Addr) error
	// Detach gives back a sandbox's bridge port while it is hibernated;
	// Attach plugs it in again.
	Detach(ctx context.Context, id string, ip netip.Addr) error
	Attach(ctx context.Context, id string, ip netip.Addr, egress network.Egress) error
	// KeepPlace makes a detached sandbox's netns file again where a
	// reboot removed it.
	KeepPlace(id string) error
	Teardown(ctx context.Context, id string) error
	List(ctx context.Context) ([]string, error)
	Destroy(ctx context.Context) error
	// Counters reads a sandbox's network byte counters.
	Counters(ctx context.Context, id string) (network.Counters, error)
}

// hostOps are the host operations besides storage, network and runtime:
// mounting a sandbox's rootfs, its cgroup freezer and CPU quota, and
// where its agent listens. realHost performs them.
type hostOps interface {
	MountAll(ctx context.Context, mounts []mount.Mount, target string) error
	Unmount(ctx context.Context, target string) error
	Freeze(ctx context.Context, cgroup string) error
	Thaw(ctx context.Context, cgroup string) error
	Frozen(cgroup string) (bool, error)
	// SetCPUQuota sets the cgroup's CPU quota: quota µs per period µs (the
	// cgroup's period already).
	SetCPUQuota(cgroup string, quota int64, period uint64) error
	// CPUCeiling is the largest share (cores) a cgroup at this path may
	// be given (+Inf: no limit).
	CPUCeiling(cgroup string) float64
	// AgentAddr is the address of the agent of the sandbox with this ID
	// and address.
	AgentAddr(id string, ip netip.Addr) string
}

// realHost mounts with package mount, freezes with package cgroups, and
// reaches agents on their sandbox's address.
type realHost struct{}

func (realHost) MountAll(ctx context.Context, m []mount.Mount, target string) error {
	return mount.All(ctx, m, target)
}
func (realHost) Unmount(ctx context.Context, target string) error { return mount.Unmount(ctx, target) }
func (realHost) Freeze(ctx context.Context, cg string) error      { return cgroups.Freeze(ctx, cg) }
func (realHost) Thaw(ctx context.Context, cg string) error        { return cgroups.Thaw(ctx, cg) }
func (realHost) Frozen(cg string) (bool, error)                   { return cgroups.Frozen(cg) }
func (realHost) SetCPUQuota(cg string, quota int64, period uint64) error {
	return cgroups.SetCPUQuota(cgroups.Root, cg, quota, period)
}
func (realHost) CPUCeiling(cg string) float64 { return cgroups.CPUCeiling(cgroups.Root, cg) }
func (realHost) AgentAddr(_ string, ip netip.Addr) string {
	return netip.AddrPortFrom(ip, agentPort).String()
}

// parts are what open builds a daemon from; nil fields are opened from the
// config (the real ones).
type parts struct {
	snaps    snapshot.Snapshotter
	net      netManager
	runtimes map[string]runtime.Runtime
	host     hostOps
}
