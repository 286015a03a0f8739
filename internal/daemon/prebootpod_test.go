package daemon

import (
	"context"
	"path/filepath"
	goruntime "runtime"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/forkbox/forkbox/internal/runtime"
	"github.com/forkbox/forkbox/internal/runtime/runsc"
	"github.com/forkbox/forkbox/internal/runtime/spec"
)

// TestCreatedFits: a placeholder spec written for one pre-booted sandbox
// (what a memory image keeps as pod.json) fits the members created ahead
// for the same key, whatever their own id, netns and cgroup; not one whose
// key or validated fields differ (runsc would refuse the restore).
func TestCreatedFits(t *testing.T) {
	// Its runsc shows the limit: the placeholder boots raised, and its
	// spec names the limit, which no created member's does.
	d := &Daemon{cfg: Config{AgentPath: "/usr/libexec/forkbox/agent", CgroupParent: "forkbox"}, host: realHost{},
		runtimes: map[string]runtime.Runtime{RuntimeGVisor: showsLimit{}}}
	key := keyOf(RuntimeGVisor, defaultConfig())
	dir := filepath.Join(t.TempDir(), "pod")
	if err := d.writePodBundle(context.Background(), dir, "sb-source", "/run/netns/fbx-sb-source", key); err != nil {
		t.Fatal(err)
	}
	read := func() *specs.Spec {
		s, err := spec.ReadBundle(dir)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	if goruntime.NumCPU() > 1 && read().Annotations[runsc.AnnotationCPULimit] == "" {
		t.Errorf("the placeholder did not boot raised: %s is not in its spec", runsc.AnnotationCPULimit)
	}
	if !d.createdFits(read(), key) {
		t.Fatal("the placeholder spec of a pre-booted sandbox does not fit members created for its key")
	}
	other := key
	other.memory *= 2
	if !d.createdFits(read(), other) {
		t.Error("a placeholder of another memory size does not fit (runsc checks no limit; the member's key is the child's)")
	}
	s := read()
	s.Process.Capabilities.Bounding = append(s.Process.Capabilities.Bounding, "CAP_NET_ADMIN")
	if d.createdFits(s, key) {
		t.Error("a placeholder with other capabilities fits")
	}
	s = read()
	s.Process.Args = append(s.Process.Args, "extra")
	if d.createdFits(s, key) {
		t.Error("a placeholder with other args fits")
	}
	s = read()
	s.Mounts = s.Mounts[:len(s.Mounts)-1]
	if d.createdFits(s, key) {
		t.Error("a placeholder with another mount list fits")
	}
}

// showsLimit is a runtime whose runsc takes the CPU limit annotation.
type showsLimit struct{ runtime.Runtime }

func (showsLimit) ShowsCPULimit(context.Context) bool { return true }
