package daemon

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/forkbox/forkbox/internal/agent"
	"github.com/forkbox/forkbox/internal/image"
	"github.com/forkbox/forkbox/internal/network"
	"github.com/forkbox/forkbox/internal/runtime/crun"
	"github.com/forkbox/forkbox/internal/runtime/runsc"
	"github.com/forkbox/forkbox/internal/runtime/spec"
	"github.com/forkbox/forkbox/internal/store"
)

// gVisor keeps all of a sandbox's memory in its sentry, and the host OOM
// killer would kill the whole sandbox (agent included) at the cgroup limit
// (gVisor has no OOM killer of its own). So the agent enforces the sandbox's
// limit by killing the largest user process, and the host limit is a
// backstop with headroom: for the sentry itself, and for what one large
// allocation adds between two polls of the agent's watchdog (a 300 MB
// allocation was seen to land within one 10 ms poll).
// With crun the kernel's OOM killer works inside the cgroup and kills the
// largest process (the agent has oom_score_adj -1000), so the limit is exact
// and the watchdog is off.
func hostMemoryLimit(runtimeName string, limit int64) int64 {
	if runtimeName == RuntimeGVisor {
		return limit + limit/2 + 512<<20
	}
	return limit
}

// watchdogLimit is the limit the agent's watchdog enforces (beside the
// sentry under a patched runsc, whose kills the agent reports too); 0 = off.
func watchdogLimit(runtimeName string, limit int64) int64 {
	if runtimeName == RuntimeGVisor {
		return limit
	}
	return 0
}

// agentEnv is the agent's configuration (cmd/forkbox-agent), the first
// entries of the sandbox's environment, and writeBundle lets no other
// agent.EnvPrefix name of the image or the caller into it (withOverrides
// refuses a caller's): of a duplicated name crun's agent takes the first
// (Go's os.Getenv) and runsc keeps one of them (its own de-duplication), so
// an image's FORKBOX_PIDS_LIMIT=0 could otherwise stand in for the daemon's.
//
// Under a runsc that enforces the memory limit in its sentry
// (memory-limit.patch), the agent's watchdog is only a backstop for the
// shared memory the sentry does not refuse, and polls every 250 ms: every
// 10 ms it read /proc for most of a gVisor sandbox's CPU whenever a server
// or an interpreter ran in it.
func (d *Daemon) agentEnv(ctx context.Context, sb *store.Sandbox) []string {
	env := []string{
		agent.EnvAddr + "=:" + strconv.Itoa(agentPort),
		agent.EnvToken + "=" + sb.AgentToken,
		agent.EnvMemoryLimit + "=" + strconv.FormatInt(watchdogLimit(sb.Runtime, sb.Config.MemoryBytes), 10),
		agent.EnvPidsLimit + "=" + strconv.FormatInt(agentPidsLimit(sb.Runtime, sb.Config.Pids), 10),
	}
	if sb.Runtime == RuntimeGVisor && d.sentryEnforcesMemory(ctx) {
		env = append(env, agent.EnvMemoryEnforcer+"=sentry")
	}
	return env
}

// noteMemoryEnforcer logs who enforces gVisor sandboxes' memory limits, at
// start (which also reads the runsc binary once, before the first create
// needs to know).
func (d *Daemon) noteMemoryEnforcer(ctx context.Context) {
	if _, ok := d.runtimes[RuntimeGVisor]; !ok {
		return
	}
	if d.sentryEnforcesMemory(ctx) {
		d.log.Info("gvisor: the sentry enforces memory limits (memory-limit.patch); the agent's watchdog is its backstop for shared memory, every 250 ms")
		return
	}
	d.log.Warn("gvisor: this runsc does not enforce memory limits (a stock build): the agent's watchdog polls every 10 ms while a process runs, and a fast allocation can pass the limit; scripts/setup.sh builds the patched runsc (SECURITY.md)")
}

// sentryEnforcesMemory reports whether the gVisor runtime enforces the
// memory limit annotation itself (runsc.Runsc.EnforcesMemoryLimit).
func (d *Daemon) sentryEnforcesMemory(ctx context.Context) bool {
	l, ok := d.runtimes[RuntimeGVisor].(interface {
		EnforcesMemoryLimit(context.Context) bool
	})
	return ok && l.EnforcesMemoryLimit(ctx)
}

// Under gVisor the host pids cgroup also counts the sentry's, gofer's and
// systrap's own tasks: the agent enforces the tenant's limit inside
// (RLIMIT_NPROC on every process it starts) and the host limit leaves room
// for the runtime (runsc.HostPidsLimit). With crun the host limit is exact.
func hostPidsLimit(runtimeName string, pids int64) int64 {
	if runtimeName == RuntimeGVisor {
		return runsc.HostPidsLimit(pids)
	}
	return pids
}

// agentPidsLimit is the limit the agent enforces itself (0 = off).
func agentPidsLimit(runtimeName string, pids int64) int64 {
	if runtimeName == RuntimeGVisor {
		return pids
	}
	return 0
}

// writeBundle writes the OCI bundle (config.json and the small /etc files)
// of a sandbox. With pod, its container starts in that running pre-booted
// sandbox, whose cgroup and limits it shares (set when it booted).
func (d *Daemon) writeBundle(ctx context.Context, sb *store.Sandbox, img image.Image, nw *network.Network, pod string) error {
	dir := d.bundleDir(sb.ID)
	env := d.agentEnv(ctx, sb)
	for _, kv := range img.Config.Env {
		if !strings.HasPrefix(kv, agent.EnvPrefix) {
			env = append(env, kv)
		}
	}
	keys := make([]string, 0, len(sb.Config.Env))
	for k := range sb.Config.Env {
		if !strings.HasPrefix(k, agent.EnvPrefix) {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		env = append(env, k+"="+sb.Config.Env[k])
	}
	cwd := sb.Config.Cwd
	if cwd == "" {
		cwd = img.Config.WorkingDir
	}
	if cwd == "" {
		cwd = "/"
	}
	ident, err := writeIdentity(dir, sb, nw)
	if err != nil {
		return err
	}
	mounts := append(ident,
		specs.Mount{Destination: "/.forkbox/agent", Type: "bind", Source: d.cfg.AgentPath,
			Options: []string{"rbind", "ro", "nosuid", "nodev"}},
		specs.Mount{Destination: secretsDir, Type: "tmpfs", Source: "tmpfs",
			Options: []string{"nosuid", "nodev", "noexec", "mode=0700", "size=16m"}},
	)
	s, err := spec.NewSpec(spec.SpecOptions{
		Rootfs:      filepath.Join(dir, "rootfs"),
		Hostname:    sb.Config.Hostname,
		Args:        []string{"/.forkbox/agent", "init"},
		Env:         env,
		Cwd:         cwd,
		NetNSPath:   nw.NSPath,
		CgroupsPath: d.cgroupPath(sb.ID),
		CPU:         sb.Config.CPU,
		MemoryBytes: hostMemoryLimit(sb.Runtime, sb.Config.MemoryBytes),
		Pids:        hostPidsLimit(sb.Runtime, sb.Config.Pids),
		Mounts:      mounts,
	})
	if err != nil {
		return err
	}
	if sb.Runtime == RuntimeCrun {
		crun.Adapt(s)
	}
	if sb.Runtime == RuntimeGVisor {
		setAppMemoryLimit(s, sb.Config.MemoryBytes)
	}
	if pod != "" {
		runsc.AsTenant(s, pod)
		s.Linux.CgroupsPath = ""
	} else {
		d.startSpec(ctx, s, sb.Runtime, sb.Config.CPU, d.cgroupPath(sb.ID), true) // its boot: cpulimit.go
	}
	if err := spec.PrepareRootfs(filepath.Join(dir, "rootfs")); err != nil {
		return err
	}
	return spec.WriteBundle(dir, s)
}

// writeIdentity writes a sandbox's identity files (hostname, hosts,
// resolv.conf, machine-id) into its bundle and returns their bind mounts.
// They live outside the writable layer: a snapshot never carries them, so
// every sandbox (forks included) gets its own hostname and machine-id. As
// they are also outside its disk limit, they are bound read-only (see
// spec.WriteEtcFiles): a sandbox cannot grow them.
func writeIdentity(bundle string, sb *store.Sandbox, nw *network.Network) ([]specs.Mount, error) {
	etc, err := spec.WriteEtcFiles(bundle, spec.EtcFiles{Hostname: sb.Config.Hostname, Hosts: []string{nw.IP.String() + "\t" + sb.Config.Hostname},
		Nameservers: nameservers(nw)})
	if err != nil {
		return nil, fmt.Errorf("bundle: %w", err)
	}
	machineID := filepath.Join(bundle, "etc", "machine-id")
	if err := os.WriteFile(machineID, []byte(sb.Config.MachineID+"\n"), 0o444); err != nil {
		return nil, diskFull("bundle", fmt.Errorf("bundle: %w", err))
	}
	return append(etc, specs.Mount{Destination: "/etc/machine-id", Type: "bind", Source: machineID, Options: append([]string(nil), spec.EtcMountOptions...)}), nil
}

// setAppMemoryLimit gives a gVisor sandbox's spec its tenant memory limit
// as the annotation a runsc built with scripts/gvisor/memory-limit.patch
// enforces at allocation (stock runsc ignores it). runsc reads it when the
// sandbox boots: from the sandbox's own spec, or from a pre-booted
// sandbox's placeholder spec.
func setAppMemoryLimit(s *specs.Spec, bytes int64) {
	if bytes <= 0 {
		return
	}
	if s.Annotations == nil {
		s.Annotations = map[string]string{}
	}
	s.Annotations[runsc.AnnotationAppMemoryLimit] = strconv.FormatInt(bytes, 10)
}
