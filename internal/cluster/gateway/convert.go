package gateway

import (
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"

	v1 "github.com/forkbox/forkbox/api/forkbox/v1"
	"github.com/forkbox/forkbox/errdefs"
	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
)

// Bounds of what a caller's request may put into an object (the CRDs
// say the same; checked here first so that the error is the caller's).
const (
	maxEnv    = 256
	maxEgress = 256
)

func quantity(field, s string) (*resource.Quantity, error) {
	if s == "" {
		return nil, nil
	}
	q, err := resource.ParseQuantity(s)
	if err != nil || q.Sign() < 0 {
		return nil, fmt.Errorf("%s %q: want a quantity such as 1, 500m, 512Mi: %w", field, s, errdefs.ErrInvalidArgument)
	}
	return &q, nil
}

func resourcesOf(r *v1.Resources) (fbv1.Resources, error) {
	var out fbv1.Resources
	if r == nil {
		return out, nil
	}
	var err error
	if out.CPU, err = quantity("cpu", r.Cpu); err != nil {
		return out, err
	}
	if out.Memory, err = quantity("memory", r.Memory); err != nil {
		return out, err
	}
	if out.Disk, err = quantity("disk", r.Disk); err != nil {
		return out, err
	}
	if r.Pids < 0 || r.Pids > 1_000_000 {
		return out, fmt.Errorf("pids %d: want 1 to 1000000: %w", r.Pids, errdefs.ErrInvalidArgument)
	}
	if r.Pids > 0 {
		p := r.Pids
		out.Pids = &p
	}
	return out, nil
}

func envList(env map[string]string) ([]fbv1.EnvVar, error) {
	if len(env) > maxEnv {
		return nil, fmt.Errorf("%d environment variables: at most %d: %w", len(env), maxEnv, errdefs.ErrInvalidArgument)
	}
	out := make([]fbv1.EnvVar, 0, len(env))
	for k, v := range env {
		out = append(out, fbv1.EnvVar{Name: k, Value: v})
	}
	slices.SortFunc(out, func(a, b fbv1.EnvVar) int { return strings.Compare(a.Name, b.Name) })
	if len(out) == 0 {
		return nil, nil
	}
	return out, nil
}

func egressSpec(mode string, allow, deny []string) (*fbv1.Egress, error) {
	if mode == "" && len(allow) == 0 && len(deny) == 0 {
		return nil, nil
	}
	switch mode {
	case "", "none", "all", "allow":
	default:
		return nil, fmt.Errorf("egress %q: want none, all or allow: %w", mode, errdefs.ErrInvalidArgument)
	}
	if len(allow) > maxEgress || len(deny) > maxEgress {
		return nil, fmt.Errorf("egress lists of %d and %d entries: at most %d: %w", len(allow), len(deny), maxEgress, errdefs.ErrInvalidArgument)
	}
	return &fbv1.Egress{Mode: mode, Allow: slices.Clone(allow), Deny: slices.Clone(deny)}, nil
}

func runtimeOf(rt string) (fbv1.Runtime, error) {
	switch rt {
	case "", string(fbv1.RuntimeGVisor), string(fbv1.RuntimeCrun):
		return fbv1.Runtime(rt), nil
	}
	return "", fmt.Errorf("runtime %q: want gvisor or crun: %w", rt, errdefs.ErrInvalidArgument)
}

// stateOf is the daemon's word for an object's phase.
func stateOf(sb *fbv1.Sandbox) string {
	switch {
	case sb.Closed():
		return "closed"
	case !sb.DeletionTimestamp.IsZero() || sb.Spec.State == fbv1.StateClosed:
		return "closing"
	}
	switch sb.Status.Phase {
	case fbv1.PhaseRunning:
		return "running"
	case fbv1.PhasePaused:
		return "paused"
	case fbv1.PhaseHibernated:
		return "hibernated"
	case fbv1.PhaseFailed, fbv1.PhaseLost:
		return "failed"
	case fbv1.PhaseTerminating:
		return "closing"
	}
	return "creating"
}

func quantityString(q *resource.Quantity) string {
	if q == nil {
		return ""
	}
	return q.String()
}

// objectView is a sandbox as its object describes it (for lists, and
// for sandboxes not on a node yet).
func objectView(sb *fbv1.Sandbox) *v1.Sandbox {
	out := &v1.Sandbox{Id: publicID(sb), Name: sb.Name, State: stateOf(sb), Image: sb.Spec.Image, Runtime: string(sb.Spec.Runtime),
		Cwd: sb.Spec.WorkingDir, Ip: sb.Status.IP, CreatedAtUnixMs: sb.CreationTimestamp.UnixMilli(),
		Resources: &v1.Resources{Cpu: quantityString(sb.Spec.Resources.CPU), Memory: quantityString(sb.Spec.Resources.Memory),
			Disk: quantityString(sb.Spec.Resources.Disk)}}
	if p := sb.Spec.Resources.Pids; p != nil {
		out.Resources.Pids = *p
	}
	if sb.Status.Phase != fbv1.PhaseRunning {
		out.Error = sb.Status.Message
	}

	if len(sb.Spec.Env) > 0 {
		out.Env = map[string]string{}
		for _, e := range sb.Spec.Env {
			out.Env[e.Name] = e.Value
		}
	}
	if e := sb.Spec.Egress; e != nil {
		out.Egress, out.EgressAllow, out.EgressDeny = e.Mode, e.Allow, e.Deny
	}
	if s := sb.Spec.Source; s != nil {
		out.FromCheckpoint = s.Checkpoint
	}
	for _, c := range sb.Spec.Credentials {
		out.Credentials = append(out.Credentials, c.Name)
	}
	return out
}

// publicID is the ID callers know a sandbox by: its node's local ID, or
// its object name while it has none yet.
func publicID(sb *fbv1.Sandbox) string {
	if sb.Status.LocalID != "" {
		return sb.Status.LocalID
	}
	return sb.Name
}

// nodeView is the node's answer about a sandbox with the object's name
// (the node knows it as k8s-<uid>).
func nodeView(s *v1.Sandbox, sb *fbv1.Sandbox) *v1.Sandbox {
	if s == nil {
		return objectView(sb)
	}
	s.Name = sb.Name
	// The node was given quantities in bytes; the caller gave them as
	// the object holds them ("256Mi"), and reads them back so.
	if r, q := s.Resources, sb.Spec.Resources; r != nil {
		if q.CPU != nil {
			r.Cpu = q.CPU.String()
		}
		if q.Memory != nil {
			r.Memory = q.Memory.String()
		}
		if q.Disk != nil {
			r.Disk = q.Disk.String()
		}
	}
	return s
}
