package runsc

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/runtime"
)

// Checkpoint commands a daemon that died left running. A held checkpoint
// (hold.go) outlives the daemon on purpose: it saves the sandbox it
// paused, then resumes it once the daemon's end of its socket is gone. A
// restarted daemon that touched the sandbox before then (its reconcile
// resumes one it finds paused) cut the save short, and the sandbox with
// it. So reconcile waits for them first.

var _ runtime.CheckpointWaiter = (*Runsc)(nil)

// WaitCheckpoints implements runtime.CheckpointWaiter: it waits until no
// `runsc checkpoint` of container id under this driver's state roots runs,
// at most for timeout (DeadlineExceeded after it).
func (r *Runsc) WaitCheckpoints(ctx context.Context, id string, timeout time.Duration) error {
	if err := validID(id); err != nil {
		return err
	}
	deadline := time.Now().Add(timeout)
	for {
		pids := r.checkpointsOf(id)
		if len(pids) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("runsc checkpoint of %s (pids %v) still runs after %s: %w", id, pids, timeout, errdefs.ErrDeadlineExceeded)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond): // polling a condition, with a deadline
		}
	}
}

// checkpointsOf lists the host pids of `runsc checkpoint` commands of
// container id whose --root is one of this driver's (its own root, or the
// shared one of older daemons).
func (r *Runsc) checkpointsOf(id string) []int {
	roots := []string{filepath.Join(r.opts.Root, id), r.opts.Root}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || len(b) == 0 {
			continue
		}
		if isCheckpointOf(bytes.Split(bytes.TrimSuffix(b, []byte{0}), []byte{0}), id, roots) {
			out = append(out, pid)
		}
	}
	return out
}

// isCheckpointOf reports whether argv is a runsc checkpoint of container
// id with one of roots as its --root: the id its last argument, the verb
// among the arguments.
func isCheckpointOf(argv [][]byte, id string, roots []string) bool {
	if len(argv) < 3 || string(argv[len(argv)-1]) != id {
		return false
	}
	verb, root := false, ""
	for i, a := range argv[:len(argv)-1] {
		switch {
		case string(a) == "checkpoint":
			verb = true
		case string(a) == "--root" && i+1 < len(argv)-1:
			root = string(argv[i+1])
		case bytes.HasPrefix(a, []byte("--root=")):
			root = string(a[len("--root="):])
		}
	}
	return verb && slices.Contains(roots, filepath.Clean(root))
}
