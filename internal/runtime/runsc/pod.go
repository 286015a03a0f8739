// Multi-container sandboxes: a pre-booted sandbox is booted with a
// placeholder as its first container (the pod), and a tenant's container is
// started inside it later, skipping the sentry's boot. runsc tells the two
// apart by CRI annotations on each spec.
//
// What the containers of one sandbox share (measured, the pinned build):
// the gVisor kernel, network stack, IPC and UTS namespace (the hostname of
// any container but the first is ignored); mount and PID namespaces are
// their own, but the first container sees every other's processes and files
// (/proc/N/root). So a pre-booted sandbox takes one tenant only, the
// placeholder runs only trusted code, and the sandbox is never reused.
// Pause, checkpoint and kill of any container act on the whole sandbox's
// kernel; a restore restores every container of the image, the first one
// first.

package runsc

import (
	"context"
	"fmt"

	"github.com/forkbox/forkbox/errdefs"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// CRI annotations runsc reads to place a container in a sandbox.
const (
	AnnotationContainerType = "io.kubernetes.cri.container-type"
	AnnotationSandboxID     = "io.kubernetes.cri.sandbox-id"
	AnnotationContainerName = "io.kubernetes.cri.container-name"
	containerTypeSandbox    = "sandbox"
	containerTypeContainer  = "container"
)

// Pod container names (every container gets a stable name: a restore
// without names panicked once).
const (
	PodContainerName    = "pod"
	TenantContainerName = "tenant"
)

// AsPod marks s as the first container (the placeholder) of sandbox podID.
func AsPod(s *specs.Spec, podID string) {
	annotate(s, containerTypeSandbox, podID, PodContainerName)
}

// AsTenant marks s as a container started inside the running sandbox podID.
func AsTenant(s *specs.Spec, podID string) {
	annotate(s, containerTypeContainer, podID, TenantContainerName)
}

func annotate(s *specs.Spec, kind, podID, name string) {
	if s.Annotations == nil {
		s.Annotations = map[string]string{}
	}
	s.Annotations[AnnotationContainerType] = kind
	s.Annotations[AnnotationSandboxID] = podID
	s.Annotations[AnnotationContainerName] = name
}

// PodOf returns the sandbox (pod) id s is a tenant of, or "".
func PodOf(s *specs.Spec) string {
	if s.Annotations[AnnotationContainerType] != containerTypeContainer {
		return ""
	}
	return s.Annotations[AnnotationSandboxID]
}

// Exec runs argv in running container id and waits for it: `runsc exec`.
// Its output is returned in the error when it fails. Only for trusted
// helpers in a placeholder; tenants' commands go through the agent.
func (r *Runsc) Exec(ctx context.Context, id string, argv ...string) error {
	if err := validID(id); err != nil {
		return err
	}
	if len(argv) == 0 {
		return fmt.Errorf("runsc exec %s: no command: %w", id, errdefs.ErrInvalidArgument)
	}
	_, err := r.command(ctx, id, append([]string{"exec", id}, argv...)...)
	return err
}
