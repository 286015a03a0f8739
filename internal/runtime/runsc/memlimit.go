package runsc

import "context"

// AnnotationAppMemoryLimit is the OCI annotation that gives a sandbox's
// memory limit (bytes) to a runsc built with scripts/gvisor/memory-limit.patch:
// its sentry charges application memory (anonymous and tmpfs) when it
// allocates it, refuses an allocation over the limit and SIGKILLs the
// process with the most memory, as Linux's memory cgroup OOM killer does.
// The stock runsc ignores it (an internal annotation). See SECURITY.md,
// "Memory limits under gVisor".
const AnnotationAppMemoryLimit = "dev.gvisor.internal.app-memory-limit"

// AnnotationCPULimit gives a sandbox's CPU limit (µs per its spec's CPU
// period) to a runsc built with scripts/gvisor/cpu-limit.patch when the
// spec's quota is a larger one the sandbox starts with: its Sentry shows
// the tenant the limit (the cpu controller's defaults in the sandbox's own
// cgroupfs), not the quota it finds in the cgroup when it boots. forkbox
// sets the limit in the cgroup once the sandbox is up.
const AnnotationCPULimit = "dev.forkbox.cpu-limit"

// ShowsCPULimit reports whether this runsc takes AnnotationCPULimit: a
// build of scripts/gvisor/build-runsc.sh (checked by its --hold-fd; a
// build from before cpu-limit.patch has that too, and setup.sh rebuilds
// it when the patches change).
func (r *Runsc) ShowsCPULimit(ctx context.Context) bool { return r.canHold(ctx) }
