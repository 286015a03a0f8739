package runsc

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"

	"github.com/forkbox/forkbox/internal/runtime"
)

// Checkpoint commands a daemon that died left running. A held checkpoint
// (hold.go) outlives the daemon on purpose: it saves the sandbox it
// paused, then resumes it once the daemon's end of its socket is gone. A
// restarted daemon that touched the sandbox before then (its reconcile
// resumes one it finds paused) cut the save short, and the sandbox with
// it. So reconcile waits for them first.

var _ runtime.CheckpointLister = (*Runsc)(nil)

// RunningCheckpoints implements runtime.CheckpointLister: the host pids of
// the `runsc checkpoint` commands under this driver's state roots, by
// container id, from one pass over /proc.
func (r *Runsc) RunningCheckpoints() map[string][]int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	out := map[string][]int{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || len(b) == 0 {
			continue
		}
		if id, ok := checkpointOf(bytes.Split(bytes.TrimSuffix(b, []byte{0}), []byte{0}), r.opts.Root); ok {
			out[id] = append(out[id], pid)
		}
	}
	return out
}

// checkpointOf returns the container id of argv when it is a runsc
// checkpoint under root: the verb among its arguments, the id its last,
// and its --root the id's own state root under root, or root itself
// (older daemons' shared one).
func checkpointOf(argv [][]byte, root string) (string, bool) {
	if len(argv) < 3 {
		return "", false
	}
	id := string(argv[len(argv)-1])
	if validID(id) != nil {
		return "", false
	}
	verb, r := false, ""
	for i, a := range argv[:len(argv)-1] {
		switch {
		case string(a) == "checkpoint":
			verb = true
		case string(a) == "--root" && i+1 < len(argv)-1:
			r = string(argv[i+1])
		case bytes.HasPrefix(a, []byte("--root=")):
			r = string(a[len("--root="):])
		}
	}
	r = filepath.Clean(r)
	return id, verb && (r == filepath.Join(root, id) || r == filepath.Clean(root))
}
