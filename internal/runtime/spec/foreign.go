package spec

import (
	"fmt"
	"slices"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/forkbox/forkbox/errdefs"
)

// foreignMountTypes are the mount types a spec from elsewhere may hold:
// those NewSpec and the daemon's bundles make. Where a bind's source may
// lie is the caller's to check.
var foreignMountTypes = []string{"", "bind", "tmpfs", "proc", "sysfs", "devpts", "mqueue", "cgroup"}

// foreignNamespaces are the namespaces a spec from elsewhere may ask for,
// each a new one (no path: a path joins an existing namespace, the
// host's for one); the network namespace's path is the caller's to set.
var foreignNamespaces = []specs.LinuxNamespaceType{specs.PIDNamespace, specs.IPCNamespace, specs.UTSNamespace,
	specs.MountNamespace, specs.NetworkNamespace, specs.CgroupNamespace}

// CheckForeign refuses a spec that comes from another node (a memory
// image's) and asks for more than the specs NewSpec makes give a
// sandbox: hooks (the runtime runs them on the host, as root),
// annotations other than annotations (they configure the runtime),
// capabilities beyond DefaultCapabilities, privileges, an existing
// namespace to join, user-namespace mappings, host devices, sysctls, a
// seccomp, SELinux or AppArmor setting of its own, cgroup settings
// NewSpec never makes (unified keys, hugepages, block I/O, network, RDMA),
// fewer masked or read-only paths, and mount types NewSpec does not make;
// and one without its root, process or linux section. The caller
// rewrites what is the receiving sandbox's (root, hostname, network
// namespace, cgroup, limits) and checks the binds' sources.
func CheckForeign(s *specs.Spec, annotations []string) error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("spec: "+format+": %w", append(a, errdefs.ErrInvalidArgument)...)
	}
	if s.Root == nil || s.Process == nil || s.Linux == nil {
		return bad("it lacks its root, process or linux section")
	}
	if s.Hooks != nil {
		return bad("hooks are not taken from another node")
	}
	for k := range s.Annotations {
		if !slices.Contains(annotations, k) {
			return bad("annotation %q is not one forkbox sets", k)
		}
	}
	if p := s.Process; p != nil {
		if !p.NoNewPrivileges {
			return bad("the process may gain privileges (noNewPrivileges is off)")
		}
		if p.ApparmorProfile != "" || p.SelinuxLabel != "" || p.OOMScoreAdj != nil || p.IOPriority != nil || p.Scheduler != nil || p.ExecCPUAffinity != nil {
			return bad("the process sets host security or scheduling attributes")
		}
		if c := p.Capabilities; c != nil {
			for _, set := range [][]string{c.Bounding, c.Effective, c.Permitted, c.Inheritable, c.Ambient} {
				for _, cp := range set {
					if !slices.Contains(DefaultCapabilities, cp) {
						return bad("capability %s is not one a sandbox has", cp)
					}
				}
			}
		}
	}
	if l := s.Linux; l != nil {
		for _, ns := range l.Namespaces {
			if !slices.Contains(foreignNamespaces, ns.Type) || (ns.Path != "" && ns.Type != specs.NetworkNamespace) {
				return bad("namespace %s %q is not a new one of the kinds a sandbox has", ns.Type, ns.Path)
			}
		}
		switch {
		case len(l.UIDMappings) > 0 || len(l.GIDMappings) > 0:
			return bad("user namespace mappings are not taken from another node")
		case len(l.Devices) > 0:
			return bad("host devices are not taken from another node")
		case len(l.Sysctl) > 0:
			return bad("sysctls are not taken from another node")
		case l.Seccomp != nil || l.MountLabel != "" || l.IntelRdt != nil || l.Personality != nil || l.RootfsPropagation != "" || l.TimeOffsets != nil:
			return bad("host security settings are not taken from another node")
		}
		// The receiving node sets the sandbox's own limits; these others
		// (cgroup v2's unified keys write any cgroup file) it never sets.
		if r := l.Resources; r != nil && (len(r.Unified) > 0 || len(r.HugepageLimits) > 0 || r.BlockIO != nil || r.Network != nil || len(r.Rdma) > 0) {
			return bad("cgroup settings other than a sandbox's are not taken from another node")
		}
		for _, p := range DefaultMaskedPaths {
			if !slices.Contains(l.MaskedPaths, p) {
				return bad("masked path %s is not masked", p)
			}
		}
		for _, p := range DefaultReadOnlyPaths {
			if !slices.Contains(l.ReadonlyPaths, p) {
				return bad("read-only path %s is not read-only", p)
			}
		}
	}
	for _, m := range s.Mounts {
		if !slices.Contains(foreignMountTypes, m.Type) {
			return bad("mount type %q at %s is not one a sandbox has", m.Type, m.Destination)
		}
	}
	return nil
}
