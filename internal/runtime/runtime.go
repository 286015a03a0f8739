// Package runtime defines how forkbox drives an OCI runtime binary (gVisor
// runsc by default, or crun): the Runtime interface and the container
// states it reports. Implementations live in subpackages (runtime/runsc,
// runtime/crun); the OCI spec and bundle builder lives in runtime/spec.
//
// Vocabulary: a container is the OCI runtime's view of one sandbox; its id is
// the sandbox ID. A bundle is a directory holding config.json (whose
// root.path is absolute and already mounted by the caller) plus the small
// files the spec bind-mounts (etc files) and the container's stdio log.
package runtime

import (
	"context"
	"syscall"
	"time"
)

// Container statuses, as the OCI runtime-spec names them.
const (
	StatusCreated = "created"
	StatusRunning = "running"
	StatusPaused  = "paused"
	StatusStopped = "stopped"
)

// State is what the runtime reports about one container.
type State struct {
	ID     string
	Status string // one of the Status* constants
	Pid    int    // host pid of the container's init (for runsc: the sandbox's init as seen by the host), 0 when stopped
	Bundle string // bundle dir the container was created from, when the runtime reports it
}

// Runtime drives one OCI runtime binary. All methods are safe to call
// concurrently for different ids.
//
// Rules every implementation keeps:
//   - Run creates and starts container id from bundle (config.json inside),
//     detached; it returns once the init process is running. The init's
//     stdout and stderr go to filepath.Join(bundle, LogFileName). An id already known is an
//     AlreadyExists error; a failed Run leaves nothing behind.
//   - State of an unknown id is a NotFound error.
//   - Kill of an unknown id is NotFound; all=true signals every process.
//   - Delete is idempotent: an unknown id returns nil. With force it kills a
//     running container first. After Delete no process, cgroup directory or
//     state entry of the container is left.
//   - List returns every container the runtime knows under its state root,
//     including stopped ones (the daemon reconciles with it after a crash).
//   - Pause freezes every process of a running container; Resume thaws it.
//     Pausing a container that is not running, or resuming one that is not
//     paused, is a FailedPrecondition error.
type Runtime interface {
	Name() string
	Run(ctx context.Context, id, bundle string) error
	State(ctx context.Context, id string) (State, error)
	Kill(ctx context.Context, id string, sig syscall.Signal, all bool) error
	Delete(ctx context.Context, id string, force bool) error
	List(ctx context.Context) ([]State, error)
	Pause(ctx context.Context, id string) error
	Resume(ctx context.Context, id string) error
}

// LogFileName is the file in the bundle dir that receives the container
// init's stdout and stderr.
const LogFileName = "stdio.log"

// MemoryCheckpointer is the optional feature of runtimes that can save a
// running container's memory and processes to an image and start
// containers from it (gVisor). One image can be restored into several
// containers: a memory fork.
//   - Checkpoint stops the container once its image is complete; the
//     caller deletes it before restoring under the same id.
//   - Restore starts container id from bundle and the image, detached. The
//     bundle's spec must keep the source's args, cwd and mount list; mount
//     sources, hostname, netns, cgroups and resources may differ.
type MemoryCheckpointer interface {
	Checkpoint(ctx context.Context, id, imageDir string) error
	Restore(ctx context.Context, id, bundle, imageDir string) error
}

// LiveCheckpointer is the optional feature of memory checkpointers that can
// save a container's memory and processes without stopping it for good
// (gVisor's checkpoint --leave-running): CheckpointLive takes a running or
// paused container and leaves it so (the caller pauses it around the save
// when it needs the filesystem captured at the same instant).
type LiveCheckpointer interface {
	CheckpointLive(ctx context.Context, id, imageDir string) error
}

// HeldCheckpointer is the optional feature of live checkpointers that hold
// a running container stopped from just before the save of its memory
// until the caller has done what must match the image (a snapshot of its
// filesystem), in one runtime call instead of a pause, a save and a resume.
// CheckpointHeld calls held (with the time the container was stopped)
// while it stands still after a successful save, and returns held's error
// with its own; the container is started again whatever held returns, or
// before held returns if held takes longer than the runtime's hold bound
// (an error then: what held captured may not match the image).
// ErrNotImplemented: this build of the runtime cannot, and nothing was
// done.
type HeldCheckpointer interface {
	CheckpointHeld(ctx context.Context, id, imageDir string, held func(paused time.Time) error) (Hold, error)
}

// CheckpointLister is the optional feature of runtimes whose checkpoint
// commands outlive a daemon that dies (a held checkpoint saves, then
// starts the container again): RunningCheckpoints lists the host pids of
// those running, by container id, so that a restarted daemon waits for
// them before it acts on their containers.
type CheckpointLister interface {
	RunningCheckpoints() map[string][]int
}

// Hold is what a held checkpoint did: whether the container may have been
// stopped, whether the image was saved, how long the save took and the
// container stood still (from its stop to its start again, as seen by the
// caller), and whether it runs again (after Paused, false means it stands
// still or died: a failure left it so).
type Hold struct {
	Paused  bool
	Saved   bool
	Save    time.Duration
	Stood   time.Duration
	Resumed bool
}
