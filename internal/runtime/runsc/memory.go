// Memory checkpoints: Checkpoint saves a running container's memory,
// processes, kernel and network-stack state to an image dir and stops it;
// Restore starts a new container from such an image. One image can be
// restored into any number of containers (a memory fork), including one that
// takes the source's place.
//
// With --overlay2=none the rootfs content is not in the image: gVisor
// re-opens the files it had open (and the cwd, mmaps, ...) by path under the
// restoring bundle's root.path when the restored sandbox starts. So the
// restoring bundle must present the same tree (a writable snapshot of the
// source's upper over the same lowers is enough; it may be mounted at a
// different host path) and the same mount destinations as the source's spec.

package runsc

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/hostproc"
	"github.com/forkbox/forkbox/internal/runtime"
)

var _ runtime.LiveCheckpointer = (*Runsc)(nil)

// CheckpointImageFile is the file runsc writes into an image dir (the
// kernel state; memory pages go to pages files beside it). Its presence
// tells a complete image from an empty or failed one.
const CheckpointImageFile = "checkpoint.img"

// Checkpoint saves container id (which must be running) to imageDir and
// stops it: `runsc checkpoint --image-path imageDir id`. imageDir must be
// absolute and empty or absent; it is created. After Checkpoint the
// container is stopped but still known to runsc: Delete it before restoring
// the image under the same id. A failed Checkpoint removes what it wrote to
// imageDir; the container may then be stopped or still running (State
// tells).
func (r *Runsc) Checkpoint(ctx context.Context, id, imageDir string) error {
	return r.checkpoint(ctx, id, imageDir, false)
}

// CheckpointLive implements runtime.LiveCheckpointer: `runsc checkpoint
// --leave-running`. The sentry saves the image and goes on in place (same
// sandbox process, network stack and connections): a paused container
// stays paused, a running one runs on. Measured on the pinned build
// (2026-12-01): a paused container is saved and left paused, with its
// pid; resume continues its processes.
func (r *Runsc) CheckpointLive(ctx context.Context, id, imageDir string) error {
	return r.checkpoint(ctx, id, imageDir, true)
}

func (r *Runsc) checkpoint(ctx context.Context, id, imageDir string, live bool) error {
	if err := checkCheckpoint(id, imageDir); err != nil {
		return err
	}
	// A live checkpoint runs while the source stands still: runsc itself
	// refuses a container that is stopped ("cannot checkpoint …":
	// FailedPrecondition), so no `state` call (a runsc start, about 12 ms)
	// goes first. runsc would also take a created one, which forkbox never
	// has (it runs containers with `runsc run`). The stopping checkpoint
	// needs the sandbox's pid below.
	var st runtime.State
	if !live {
		var err error
		if st, err = r.State(ctx, id); err != nil {
			return err
		}
		if st.Status != runtime.StatusRunning {
			return fmt.Errorf("runsc checkpoint %s: container is %s, not running: %w", id, st.Status, errdefs.ErrFailedPrecondition)
		}
	}
	if err := makeImageDir(id, imageDir); err != nil {
		return err
	}
	t0 := time.Now()
	args := []string{"checkpoint", "--image-path", imageDir}
	if live {
		args = append(args, "--leave-running")
	}
	if _, err := r.runIn(ctx, r.RootOf(id), id, append(args, id)...); err != nil {
		os.RemoveAll(imageDir)
		return err
	}
	if err := imageSaved(id, imageDir); err != nil {
		os.RemoveAll(imageDir)
		return err
	}
	if live {
		r.log.Debug("container checkpointed, left as it was", "sandbox", id, "image", imageDir, "took", time.Since(t0))
		return nil
	}
	// The sandbox process exits after the save, but runsc state keeps
	// saying "running" while it is an unreaped zombie (its parent is
	// whoever reaps orphans). Wait until it is a zombie or gone, so that
	// "the container stopped" holds when we return.
	if err := waitExited(ctx, st.Pid, 10*time.Second); err != nil {
		return fmt.Errorf("runsc checkpoint %s: sandbox pid %d: %w", id, st.Pid, err)
	}
	r.log.Debug("container checkpointed", "sandbox", id, "image", imageDir, "took", time.Since(t0))
	return nil
}

// checkCheckpoint checks a checkpoint's arguments: a valid id, an absolute
// image dir, empty or absent.
func checkCheckpoint(id, imageDir string) error {
	if err := validID(id); err != nil {
		return err
	}
	if !filepath.IsAbs(imageDir) {
		return fmt.Errorf("runsc checkpoint %s: image dir %q must be absolute: %w", id, imageDir, errdefs.ErrInvalidArgument)
	}
	if ents, err := os.ReadDir(imageDir); err == nil && len(ents) > 0 {
		return fmt.Errorf("runsc checkpoint %s: image dir %s is not empty: %w", id, imageDir, errdefs.ErrAlreadyExists)
	}
	return nil
}

// makeImageDir makes a checkpoint's image dir.
func makeImageDir(id, imageDir string) error {
	if err := os.MkdirAll(imageDir, 0o700); err != nil {
		return fmt.Errorf("runsc checkpoint %s: %v: %w", id, err, errdefs.ErrInternal)
	}
	return nil
}

// imageSaved checks that a checkpoint wrote its image (CheckpointImageFile).
func imageSaved(id, imageDir string) error {
	if _, err := os.Stat(filepath.Join(imageDir, CheckpointImageFile)); err != nil {
		return fmt.Errorf("runsc checkpoint %s: no %s in the image: %v: %w", id, CheckpointImageFile, err, errdefs.ErrInternal)
	}
	return nil
}

// Restore creates container id from bundle and starts it from the image in
// imageDir, detached: `runsc restore --detach --image-path imageDir --bundle
// bundle id`. The processes continue where the checkpoint left them; their
// output goes to bundle/stdio.log as with Run. The bundle's spec must keep
// the source's mount destinations and its root.path must show the source's
// files at checkpoint time (see the package notes above); its hostname,
// network namespace path, cgroup path and limits may differ, but gVisor keeps
// the hostname and the network configuration (addresses, routes) from the
// image. An id already known is AlreadyExists, a missing image NotFound; a
// failed Restore leaves nothing behind.
func (r *Runsc) Restore(ctx context.Context, id, bundle, imageDir string) error {
	if err := checkRestore(id, bundle, imageDir); err != nil {
		return err
	}
	// A path the spec or the image needs is missing: the caller's input
	// (or a rootfs that does not match the image), not an unknown container.
	//
	// --background: the sentry goes on loading the image's pages after
	// the restore returns (the image is uncompressed: checkpoints are
	// taken with runsc's default --compression=none), so a child runs
	// before all of its memory is read; pages it touches first are loaded
	// on demand.
	return r.detached(ctx, "restore", id, bundle, errdefs.ErrFailedPrecondition, restoreFlags(imageDir)...)
}

// checkRestore checks a restore's arguments: a valid id, absolute paths,
// and a complete image.
func checkRestore(id, bundle, imageDir string) error {
	if err := validID(id); err != nil {
		return err
	}
	if !filepath.IsAbs(bundle) || !filepath.IsAbs(imageDir) {
		return fmt.Errorf("runsc restore %s: bundle %q and image dir %q must be absolute: %w", id, bundle, imageDir, errdefs.ErrInvalidArgument)
	}
	if _, err := os.Stat(filepath.Join(imageDir, CheckpointImageFile)); err != nil {
		return fmt.Errorf("runsc restore %s: image %s: %v: %w", id, imageDir, err, errdefs.ErrNotFound)
	}
	return nil
}

// restoreFlags are the flags of every restore from imageDir (see Restore on
// --background).
func restoreFlags(imageDir string) []string {
	return []string{"--image-path", imageDir, "--background"}
}

// waitExited waits until host pid is gone or a zombie.
func waitExited(ctx context.Context, pid int, timeout time.Duration) error {
	if !hostproc.WaitExited(ctx, pid, timeout) {
		if err := ctx.Err(); err != nil {
			return err
		}
		return fmt.Errorf("still running after %v: %w", timeout, errdefs.ErrInternal)
	}
	return nil
}
