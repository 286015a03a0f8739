// Package spec builds the OCI runtime spec (config.json) for a forkbox
// sandbox with hardened defaults modelled on runc's and containerd's default
// spec, and writes OCI bundles. It performs no mounts: the rootfs is mounted
// by the caller, and extra mounts are described here as data.
package spec

import (
	"fmt"
	"math"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/forkbox/forkbox/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// CPUPeriod is the CFS period (µs) that CPU limits are expressed against.
const CPUPeriod = 100000

// Limits accepted by NewSpec.
const (
	MinMemoryBytes = 4 << 20 // below this the sandbox cannot start
	MaxCPU         = 1024.0  // cores
	minCPUQuota    = 1000    // µs; the kernel's floor for cfs_quota_us
)

// DefaultPath is added to the env when SpecOptions.Env has no PATH.
const DefaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// DefaultNofile is the RLIMIT_NOFILE (soft and hard) of the init process.
const DefaultNofile = 1048576

// SpecOptions are what a sandbox's spec is built from. Zero values mean "no
// limit" or "default".
type SpecOptions struct {
	Rootfs      string        // absolute path, already mounted by the caller
	Hostname    string        // UTS hostname
	Args        []string      // init's argv; required
	Env         []string      // KEY=VALUE; PATH is added when missing
	Cwd         string        // absolute; default "/"
	NetNSPath   string        // network namespace to join; empty = a new, empty one
	CgroupsPath string        // "/forkbox/<id>" (cgroupfs, v1 and v2) or "slice:prefix:name" (systemd)
	CPU         float64       // cores; 0 = no limit; becomes cfs quota over CPUPeriod
	MemoryBytes int64         // 0 = no limit
	Pids        int64         // 0 = no limit
	Mounts      []specs.Mount // extra mounts, appended after the standard ones
	// ReadOnlyPaths and MaskedPaths replace the defaults when non-nil.
	ReadOnlyPaths []string
	MaskedPaths   []string
}

// DefaultCapabilities is Docker's default capability set without
// CAP_NET_RAW: with raw packets a sandbox could forge the Ethernet source of
// another sandbox on the shared bridge (the bridge rules check addresses,
// not MACs). gVisor gives no raw sockets anyway (runsc runs without
// --net-raw); under crun this drops ping.
var DefaultCapabilities = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD",
	"CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP",
	"CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE",
}

// DefaultMaskedPaths are hidden from the sandbox (as runc/containerd do).
var DefaultMaskedPaths = []string{
	"/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys",
	"/proc/latency_stats", "/proc/timer_list", "/proc/timer_stats",
	"/proc/sched_debug", "/proc/scsi", "/sys/firmware",
	"/sys/devices/virtual/powercap",
}

// DefaultReadOnlyPaths are remounted read-only in the sandbox.
var DefaultReadOnlyPaths = []string{
	"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger",
}

// NewSpec validates o and returns the spec for it. Bad input is an
// InvalidArgument error.
func NewSpec(o SpecOptions) (*specs.Spec, error) {
	if err := validate(&o); err != nil {
		return nil, err
	}
	caps := append([]string(nil), DefaultCapabilities...)
	s := &specs.Spec{
		Version: specs.Version,
		Root:    &specs.Root{Path: o.Rootfs},
		Process: &specs.Process{
			User: specs.User{UID: 0, GID: 0},
			Args: append([]string(nil), o.Args...),
			Env:  withPath(o.Env),
			Cwd:  o.Cwd,
			Capabilities: &specs.LinuxCapabilities{
				Bounding: caps, Effective: caps, Permitted: caps,
			},
			Rlimits:         []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Hard: DefaultNofile, Soft: DefaultNofile}},
			NoNewPrivileges: true,
		},
		Hostname: o.Hostname,
		Mounts:   mounts(o),
		Linux: &specs.Linux{
			CgroupsPath: o.CgroupsPath,
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace},
				{Type: specs.IPCNamespace},
				{Type: specs.UTSNamespace},
				{Type: specs.MountNamespace},
				{Type: specs.NetworkNamespace, Path: o.NetNSPath},
				{Type: specs.CgroupNamespace},
			},
			Resources:     resources(o),
			MaskedPaths:   DefaultMaskedPaths,
			ReadonlyPaths: DefaultReadOnlyPaths,
		},
	}
	if o.MaskedPaths != nil {
		s.Linux.MaskedPaths = o.MaskedPaths
	}
	if o.ReadOnlyPaths != nil {
		s.Linux.ReadonlyPaths = o.ReadOnlyPaths
	}
	return s, nil
}

func validate(o *SpecOptions) error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("spec: "+format+": %w", append(a, errdefs.ErrInvalidArgument)...)
	}
	if o.Rootfs == "" || !filepath.IsAbs(o.Rootfs) {
		return bad("rootfs %q must be an absolute path", o.Rootfs)
	}
	if len(o.Args) == 0 || o.Args[0] == "" {
		return bad("args must not be empty")
	}
	if o.Cwd == "" {
		o.Cwd = "/"
	}
	if !path.IsAbs(o.Cwd) {
		return bad("cwd %q must be absolute", o.Cwd)
	}
	if len(o.Hostname) > 64 || strings.ContainsAny(o.Hostname, "/ \t\n\x00") {
		return bad("hostname %q is not valid", o.Hostname)
	}
	for _, e := range o.Env {
		if !strings.Contains(e, "=") || strings.HasPrefix(e, "=") || strings.ContainsRune(e, 0) {
			return bad("env entry %q is not KEY=VALUE", e)
		}
	}
	if o.NetNSPath != "" && !filepath.IsAbs(o.NetNSPath) {
		return bad("netns path %q must be absolute", o.NetNSPath)
	}
	if err := validCgroupsPath(o.CgroupsPath); err != nil {
		return bad("%v", err)
	}
	switch {
	case math.IsNaN(o.CPU) || math.IsInf(o.CPU, 0) || o.CPU < 0:
		return bad("cpu %v must be a finite number ≥ 0", o.CPU)
	case o.CPU > MaxCPU:
		return bad("cpu %v exceeds %v cores", o.CPU, MaxCPU)
	case o.CPU > 0 && CPUQuota(o.CPU) < minCPUQuota:
		return bad("cpu %v is below the minimum of %v cores", o.CPU, float64(minCPUQuota)/CPUPeriod)
	}
	if o.MemoryBytes < 0 || (o.MemoryBytes > 0 && o.MemoryBytes < MinMemoryBytes) {
		return bad("memory %d bytes must be 0 (no limit) or ≥ %d", o.MemoryBytes, MinMemoryBytes)
	}
	if o.Pids < 0 {
		return bad("pids %d must be ≥ 0", o.Pids)
	}
	for _, m := range o.Mounts {
		if !path.IsAbs(m.Destination) {
			return bad("mount destination %q must be absolute", m.Destination)
		}
	}
	return nil
}

// validCgroupsPath accepts "" (runtime default), a cgroupfs path
// ("/forkbox/<id>", without "..") or the systemd form "slice:prefix:name".
func validCgroupsPath(p string) error {
	switch {
	case p == "":
		return nil
	case strings.HasPrefix(p, "/"):
		if path.Clean(p) != p || strings.Contains(p, "..") || p == "/" {
			return fmt.Errorf("cgroups path %q is not clean", p)
		}
		return nil
	case strings.Count(p, ":") == 2 && !strings.Contains(p, "/"):
		return nil
	}
	return fmt.Errorf("cgroups path %q must be absolute (cgroupfs) or slice:prefix:name (systemd)", p)
}

// CPUQuota is the CFS quota (µs per CPUPeriod) of a limit of cores.
func CPUQuota(cores float64) int64 { return int64(math.Round(cores * CPUPeriod)) }

// SetCPU gives s a CPU limit of cores (0: none), replacing the one it had.
func SetCPU(s *specs.Spec, cores float64) {
	if s.Linux == nil {
		s.Linux = &specs.Linux{}
	}
	if s.Linux.Resources == nil {
		s.Linux.Resources = &specs.LinuxResources{}
	}
	s.Linux.Resources.CPU = cpuLimit(cores)
}

func cpuLimit(cores float64) *specs.LinuxCPU {
	if cores <= 0 {
		return nil
	}
	q, p := CPUQuota(cores), uint64(CPUPeriod)
	return &specs.LinuxCPU{Quota: &q, Period: &p}
}

func withPath(env []string) []string {
	out := append([]string(nil), env...)
	for _, e := range out {
		if strings.HasPrefix(e, "PATH=") {
			return out
		}
	}
	return append(out, DefaultPath)
}

func resources(o SpecOptions) *specs.LinuxResources {
	r := &specs.LinuxResources{Devices: defaultDevices(), CPU: cpuLimit(o.CPU)}
	if o.MemoryBytes > 0 {
		m := o.MemoryBytes
		r.Memory = &specs.LinuxMemory{Limit: &m}
	}
	if o.Pids > 0 {
		p := o.Pids
		r.Pids = &specs.LinuxPids{Limit: &p}
	}
	return r
}

// mounts returns the standard mounts, a bind of the rootfs's own /tmp over
// /tmp unless the caller mounts something there, then o.Mounts.
//
// The /tmp bind matters for gVisor: runsc mounts a sandbox-internal tmpfs on
// an empty /tmp that has no explicit mount, so files written there would
// never reach the host rootfs (and so never a snapshot). The caller makes
// sure Rootfs/tmp exists (see PrepareRootfs).
func mounts(o SpecOptions) []specs.Mount {
	ms := defaultMounts()
	if !slices.ContainsFunc(o.Mounts, func(m specs.Mount) bool { return path.Clean(m.Destination) == "/tmp" }) {
		ms = append(ms, specs.Mount{
			Destination: "/tmp",
			Type:        "bind",
			Source:      filepath.Join(o.Rootfs, "tmp"),
			Options:     []string{"rbind", "rprivate"},
		})
	}
	return append(ms, o.Mounts...)
}

func defaultMounts() []specs.Mount {
	return []specs.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
		{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"}},
		{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
		{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue", Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
		{Destination: "/sys/fs/cgroup", Type: "cgroup", Source: "cgroup", Options: []string{"nosuid", "noexec", "nodev", "relatime", "ro"}},
	}
}

// defaultDevices denies every device, then allows the standard ones (as
// containerd's default spec does).
// DefaultDevices are the device cgroup rules of every sandbox.
func DefaultDevices() []specs.LinuxDeviceCgroup { return defaultDevices() }

func defaultDevices() []specs.LinuxDeviceCgroup {
	i := func(v int64) *int64 { return &v }
	return []specs.LinuxDeviceCgroup{
		{Allow: false, Access: "rwm"},
		{Allow: true, Type: "c", Major: i(1), Minor: i(3), Access: "rwm"},  // null
		{Allow: true, Type: "c", Major: i(1), Minor: i(5), Access: "rwm"},  // zero
		{Allow: true, Type: "c", Major: i(1), Minor: i(7), Access: "rwm"},  // full
		{Allow: true, Type: "c", Major: i(1), Minor: i(8), Access: "rwm"},  // random
		{Allow: true, Type: "c", Major: i(1), Minor: i(9), Access: "rwm"},  // urandom
		{Allow: true, Type: "c", Major: i(5), Minor: i(0), Access: "rwm"},  // tty
		{Allow: true, Type: "c", Major: i(5), Minor: i(2), Access: "rwm"},  // ptmx
		{Allow: true, Type: "c", Major: i(136), Minor: nil, Access: "rwm"}, // pts/*
	}
}
