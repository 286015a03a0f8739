package daemon

import (
	"context"
	"reflect"
	"strconv"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/forkbox/forkbox/internal/runtime/runsc"
	"github.com/forkbox/forkbox/internal/runtime/spec"
	"github.com/forkbox/forkbox/internal/store"
)

// A spec taken from a memory image (another node's, perhaps) gets the
// restored sandbox's own cgroup, limits and device rules, whatever the
// image's said or left out: another cgroup to join, every device, no
// memory or pids limit.
func TestOwnCgroupOverridesImage(t *testing.T) {
	d := &Daemon{cfg: Config{CgroupParent: "fbx"}}
	sb := &store.Sandbox{ID: "sb-1", Runtime: RuntimeCrun, Config: store.SandboxConfig{MemoryBytes: 256 << 20, Pids: 100}}
	huge := int64(1 << 50)
	for name, s := range map[string]*specs.Spec{
		"no resources": {Linux: &specs.Linux{CgroupsPath: "/"}},
		"no linux":     {},
		"its own": {Linux: &specs.Linux{CgroupsPath: "/fbx/sb-victim", Resources: &specs.LinuxResources{
			Devices: []specs.LinuxDeviceCgroup{{Allow: true, Access: "rwm"}}, Unified: map[string]string{"memory.max": "max"},
			Memory: &specs.LinuxMemory{Limit: &huge, Swap: &huge}, Pids: &specs.LinuxPids{Limit: &huge}}}},
	} {
		d.ownCgroup(context.Background(), s, sb)
		r := s.Linux.Resources
		if s.Linux.CgroupsPath != "/fbx/sb-1" || !reflect.DeepEqual(r.Devices, spec.DefaultDevices()) || r.Unified != nil ||
			r.Memory == nil || *r.Memory.Limit != 256<<20 || r.Memory.Swap != nil || r.Pids == nil || *r.Pids.Limit != 100 {
			t.Errorf("%s: cgroup %q, resources %+v", name, s.Linux.CgroupsPath, r)
		}
	}
	// The sentry's own memory limit is the sandbox's too.
	g := &store.Sandbox{ID: "sb-2", Runtime: RuntimeGVisor, Config: store.SandboxConfig{MemoryBytes: 256 << 20}}
	s := &specs.Spec{Linux: &specs.Linux{}, Annotations: map[string]string{runsc.AnnotationAppMemoryLimit: "999999999999"}}
	d.ownCgroup(context.Background(), s, g)
	if got := s.Annotations[runsc.AnnotationAppMemoryLimit]; got != strconv.Itoa(256<<20) {
		t.Errorf("the sentry's memory limit: %q, want the sandbox's", got)
	}
}
