package nodeagent

import (
	"strconv"

	"k8s.io/apimachinery/pkg/api/resource"

	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
	"github.com/forkbox/forkbox/internal/daemon"
	"github.com/forkbox/forkbox/internal/store"
)

func bytesOf(q *resource.Quantity) string {
	if q == nil {
		return ""
	}
	return strconv.FormatInt(q.Value(), 10)
}

func cpuOf(q *resource.Quantity) string {
	if q == nil {
		return ""
	}
	return strconv.FormatInt(q.MilliValue(), 10) + "m"
}

func envOf(env []fbv1.EnvVar) map[string]string {
	if len(env) == 0 {
		return nil
	}
	m := make(map[string]string, len(env))
	for _, e := range env {
		m[e.Name] = e.Value
	}
	return m
}

func egressOf(e *fbv1.Egress) (mode string, allow, deny []string) {
	if e == nil {
		return "", nil, nil
	}
	return e.Mode, e.Allow, e.Deny
}

// createOptions is a fresh sandbox of spec, named name on this node.
func createOptions(spec *fbv1.SandboxSpec, name string) daemon.CreateOptions {
	mode, allow, deny := egressOf(spec.Egress)
	var pids int64
	if spec.Resources.Pids != nil {
		pids = *spec.Resources.Pids
	}
	return daemon.CreateOptions{Image: spec.Image, Name: name, Runtime: string(spec.Runtime),
		CPU: cpuOf(spec.Resources.CPU), Memory: bytesOf(spec.Resources.Memory), Disk: bytesOf(spec.Resources.Disk), Pids: pids,
		Env: envOf(spec.Env), Cwd: spec.WorkingDir, Egress: mode, EgressAllow: allow, EgressDeny: deny}
}

// overrides are what spec changes over the checkpoint it starts from.
func overrides(spec *fbv1.SandboxSpec, name string) daemon.Overrides {
	mode, allow, deny := egressOf(spec.Egress)
	var pids int64
	if spec.Resources.Pids != nil {
		pids = *spec.Resources.Pids
	}
	return daemon.Overrides{Name: name, CPU: cpuOf(spec.Resources.CPU), Memory: bytesOf(spec.Resources.Memory),
		Disk: bytesOf(spec.Resources.Disk), Pids: pids, Env: envOf(spec.Env), Cwd: spec.WorkingDir,
		Egress: mode, EgressAllow: allow, EgressDeny: deny}
}

// phaseOf is the phase of a local sandbox's state.
func phaseOf(st store.State) fbv1.SandboxPhase {
	switch st {
	case store.StateRunning:
		return fbv1.PhaseRunning
	case store.StatePaused:
		return fbv1.PhasePaused
	case store.StateHibernated, store.StateHibernating:
		return fbv1.PhaseHibernated
	case store.StateCreating:
		return fbv1.PhaseCreating
	case store.StateClosing:
		return fbv1.PhaseTerminating
	case store.StateClosed:
		return fbv1.PhaseClosed
	default: // failed, degraded
		return fbv1.PhaseFailed
	}
}
