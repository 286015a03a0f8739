package runsc

import (
	"bytes"
	"context"
	"io"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

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

// memoryLimitSupport caches EnforcesMemoryLimit per binary: its path and
// the file's identity, so that a runsc replaced while the daemon runs (a
// rebuild, a stock build installed over the patched one) is read again.
var memoryLimitSupport sync.Map // binaryID -> bool

type binaryID struct {
	path       string
	dev, ino   uint64
	size       int64
	mtimeNanos int64
}

// EnforcesMemoryLimit reports whether this runsc is built with
// scripts/gvisor/memory-limit.patch, so that its sentry enforces
// AnnotationAppMemoryLimit: the annotation's name is in the binary (a stock
// runsc has no such string). The binary is read once per version of its
// file.
func (r *Runsc) EnforcesMemoryLimit(ctx context.Context) bool {
	bin := r.binary()
	var st unix.Stat_t
	if err := unix.Stat(bin, &st); err != nil {
		r.log.Warn("runsc: reading the binary for the memory limit patch", "binary", bin, "err", err)
		return false
	}
	id := binaryID{path: bin, dev: st.Dev, ino: st.Ino, size: st.Size, mtimeNanos: st.Mtim.Nano()}
	if v, ok := memoryLimitSupport.Load(id); ok {
		return v.(bool)
	}
	ok, err := fileContains(bin, []byte(AnnotationAppMemoryLimit))
	if err != nil {
		r.log.Warn("runsc: reading the binary for the memory limit patch", "binary", bin, "err", err)
		return false // unread: asked again next time
	}
	memoryLimitSupport.Store(id, ok)
	return ok
}

// fileContains reports whether the file at path holds needle, read in
// chunks that overlap by len(needle)-1 bytes.
func fileContains(path string, needle []byte) (bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	buf := make([]byte, 1<<20+len(needle))
	keep := 0
	for {
		n, err := io.ReadFull(f, buf[keep:])
		if bytes.Contains(buf[:keep+n], needle) {
			return true, nil
		}
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		keep = min(len(needle)-1, keep+n)
		copy(buf, buf[len(buf)-keep:])
	}
}
