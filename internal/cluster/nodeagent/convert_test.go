package nodeagent

import (
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"

	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
	"github.com/forkbox/forkbox/internal/daemon"
	"github.com/forkbox/forkbox/internal/store"
)

// A Sandbox's quantities reach the daemon in forms its parsers take, with
// the same values.
func TestCreateOptionsQuantities(t *testing.T) {
	q := func(s string) *resource.Quantity { v := resource.MustParse(s); return &v }
	pids := int64(64)
	spec := fbv1.SandboxSpec{Image: "busybox", Runtime: fbv1.RuntimeCrun,
		Resources: fbv1.Resources{CPU: q("1500m"), Memory: q("512Mi"), Disk: q("2G"), Pids: &pids},
		Env:       []fbv1.EnvVar{{Name: "A", Value: "1"}}, WorkingDir: "/w",
		Egress: &fbv1.Egress{Mode: "allow", Allow: []string{"example.com"}}}
	o := createOptions(&spec, "k8s-x")
	cpu, err := daemon.ParseCPU(o.CPU)
	if err != nil || cpu != 1.5 {
		t.Fatalf("cpu %q: got %v, %v; want 1.5", o.CPU, cpu, err)
	}
	mem, err := daemon.ParseMemory(o.Memory)
	if err != nil || mem != 512<<20 {
		t.Fatalf("memory %q: got %v, %v; want %d", o.Memory, mem, err, 512<<20)
	}
	disk, err := daemon.ParseDisk(o.Disk)
	if err != nil || disk != 2e9 {
		t.Fatalf("disk %q: got %v, %v; want 2e9", o.Disk, disk, err)
	}
	if o.Name != "k8s-x" || o.Runtime != "crun" || o.Pids != 64 || o.Env["A"] != "1" || o.Cwd != "/w" ||
		o.Egress != "allow" || len(o.EgressAllow) != 1 {
		t.Fatalf("got %+v", o)
	}
	if o := createOptions(&fbv1.SandboxSpec{Image: "busybox"}, "n"); o.CPU != "" || o.Memory != "" || o.Disk != "" || o.Env != nil {
		t.Fatalf("unset resources: got %+v, want the daemon's defaults", o)
	}
}

func TestPhaseOf(t *testing.T) {
	for st, want := range map[store.State]fbv1.SandboxPhase{
		store.StateRunning: fbv1.PhaseRunning, store.StatePaused: fbv1.PhasePaused, store.StateHibernated: fbv1.PhaseHibernated,
		store.StateCreating: fbv1.PhaseCreating, store.StateClosed: fbv1.PhaseClosed, store.StateDegraded: fbv1.PhaseFailed,
	} {
		if got := phaseOf(st); got != want {
			t.Errorf("phaseOf(%s): got %s, want %s", st, got, want)
		}
	}
}
