package spec

import (
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/forkbox/forkbox/errdefs"
)

// A spec from another node passes when it is what NewSpec makes (with the
// annotations the caller allows), and is refused when it asks for more: a
// hook, an annotation, a capability, privileges, a namespace to join,
// mappings, devices, sysctls, fewer masked or read-only paths, another
// mount type.
func TestCheckForeign(t *testing.T) {
	base := func(t *testing.T) *specs.Spec {
		s, err := NewSpec(SpecOptions{Rootfs: "/r", Args: []string{"sh"}, NetNSPath: "/run/netns/x", CgroupsPath: "/forkbox/sb-1",
			MemoryBytes: 1 << 30, Mounts: []specs.Mount{{Destination: "/tmp", Type: "bind", Source: "/r/tmp", Options: []string{"rbind"}}}})
		if err != nil {
			t.Fatal(err)
		}
		s.Annotations = map[string]string{"dev.forkbox.cpu-limit": "100000"}
		return s
	}
	allowed := []string{"dev.forkbox.cpu-limit"}
	if err := CheckForeign(base(t), allowed); err != nil {
		t.Fatalf("NewSpec's own: %v", err)
	}
	for name, change := range map[string]func(*specs.Spec){
		"a hook":                 func(s *specs.Spec) { s.Hooks = &specs.Hooks{Prestart: []specs.Hook{{Path: "/bin/sh"}}} },
		"an empty hooks section": func(s *specs.Spec) { s.Hooks = &specs.Hooks{} },
		"another annotation":     func(s *specs.Spec) { s.Annotations["dev.gvisor.spec.mount.x.share"] = "shared" },
		"a capability": func(s *specs.Spec) {
			s.Process.Capabilities.Bounding = append(s.Process.Capabilities.Bounding, "CAP_SYS_ADMIN")
		},
		"an ambient capability":    func(s *specs.Spec) { s.Process.Capabilities.Ambient = []string{"CAP_SYS_PTRACE"} },
		"privileges":               func(s *specs.Spec) { s.Process.NoNewPrivileges = false },
		"an AppArmor profile":      func(s *specs.Spec) { s.Process.ApparmorProfile = "unconfined" },
		"the host's pid namespace": func(s *specs.Spec) { s.Linux.Namespaces[0].Path = "/proc/1/ns/pid" },
		"a user namespace": func(s *specs.Spec) {
			s.Linux.Namespaces = append(s.Linux.Namespaces, specs.LinuxNamespace{Type: specs.UserNamespace})
		},
		"uid mappings": func(s *specs.Spec) {
			s.Linux.UIDMappings = []specs.LinuxIDMapping{{HostID: 0, ContainerID: 0, Size: 1}}
		},
		"a host device":        func(s *specs.Spec) { s.Linux.Devices = []specs.LinuxDevice{{Path: "/dev/sda", Type: "b"}} },
		"a sysctl":             func(s *specs.Spec) { s.Linux.Sysctl = map[string]string{"kernel.x": "1"} },
		"a seccomp of its own": func(s *specs.Spec) { s.Linux.Seccomp = &specs.LinuxSeccomp{DefaultAction: specs.ActAllow} },
		"kcore unmasked":       func(s *specs.Spec) { s.Linux.MaskedPaths = s.Linux.MaskedPaths[1:] },
		"/proc/sys writable":   func(s *specs.Spec) { s.Linux.ReadonlyPaths = nil },
		"a cgroup v2 key":      func(s *specs.Spec) { s.Linux.Resources.Unified = map[string]string{"cgroup.procs": "1"} },
		"hugepage limits": func(s *specs.Spec) {
			s.Linux.Resources.HugepageLimits = []specs.LinuxHugepageLimit{{Pagesize: "2MB", Limit: 1}}
		},
		"no linux section": func(s *specs.Spec) { s.Linux = nil },
		"no root":          func(s *specs.Spec) { s.Root = nil },
		"an nfs mount": func(s *specs.Spec) {
			s.Mounts = append(s.Mounts, specs.Mount{Destination: "/n", Type: "nfs", Source: "h:/x"})
		},
	} {
		s := base(t)
		change(s)
		if err := CheckForeign(s, allowed); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%s: got %v, want InvalidArgument", name, err)
		}
	}
}
