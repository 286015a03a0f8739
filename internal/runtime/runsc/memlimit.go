package runsc

// AnnotationAppMemoryLimit is the OCI annotation that gives a sandbox's
// memory limit (bytes) to a runsc built with scripts/gvisor/memory-limit.patch:
// its sentry charges application memory (anonymous and tmpfs) when it
// allocates it, refuses an allocation over the limit and SIGKILLs the
// process with the most memory, as Linux's memory cgroup OOM killer does.
// The stock runsc ignores it (an internal annotation). See SECURITY.md,
// "Memory limits under gVisor".
const AnnotationAppMemoryLimit = "dev.gvisor.internal.app-memory-limit"
