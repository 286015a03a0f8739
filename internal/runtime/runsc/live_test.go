// Live checkpoints (--leave-running): the container is saved and left as
// it was, paused or running, with the same sandbox process; a child
// restored from the image continues the processes.

package runsc

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/runtime"
	"github.com/forkbox/forkbox/internal/runtime/testsuite"
)

func TestCheckpointLive(t *testing.T) {
	g := newMFRig(t)
	rt, tmp, lower, args := g.rt, g.tmp, g.lower, g.args
	ctx := context.Background()
	srcDir, src := g.source(t, "fbx-live")
	before, err := rt.State(ctx, src.ID)
	if err != nil {
		t.Fatal(err)
	}

	// Paused: saved and left paused, the same sandbox process.
	if err := rt.Pause(ctx, src.ID); err != nil {
		t.Fatal(err)
	}
	img := filepath.Join(tmp, "image")
	if err := rt.CheckpointLive(ctx, src.ID, img); err != nil {
		t.Fatalf("live checkpoint of a paused container: %v", err)
	}
	st, err := rt.State(ctx, src.ID)
	if err != nil || st.Status != runtime.StatusPaused || st.Pid != before.Pid {
		t.Fatalf("after a live checkpoint of a paused container: %+v, %v; want paused with pid %d", st, err, before.Pid)
	}
	// The child's filesystem is the source's as the checkpoint saw it,
	// copied while the source is still paused (the daemon snapshots it
	// there too): a later copy can lack a file the image still holds
	// open, such as a counter.new renamed away after the resume, and
	// restore then fails to walk it.
	kidDir := g.childDir(t, srcDir, "kid")
	n := lastInt(filepath.Join(src.Bundle, "stdio.log"))
	if err := rt.Resume(ctx, src.ID); err != nil {
		t.Fatal(err)
	}
	src.WaitLog(t, fmt.Sprintf("tick=%d ", n+3), 60*time.Second)

	// Running: saved and left running.
	img2 := filepath.Join(tmp, "image2")
	if err := rt.CheckpointLive(ctx, src.ID, img2); err != nil {
		t.Fatalf("live checkpoint of a running container: %v", err)
	}
	if st, err := rt.State(ctx, src.ID); err != nil || st.Status != runtime.StatusRunning || st.Pid != before.Pid {
		t.Fatalf("after a live checkpoint of a running container: %+v, %v", st, err)
	}
	n = lastInt(filepath.Join(src.Bundle, "stdio.log"))
	src.WaitLog(t, fmt.Sprintf("tick=%d ", n+3), 60*time.Second)

	// A child restored (with background page loading) from the first
	// image continues from where the source was paused.
	kid := mfBundle(t, rt, kidDir, mfOverlay(t, lower, kidDir), "fbx-live-kid", testsuite.Netns(t), args)
	if err := rt.Restore(ctx, kid.ID, kid.Bundle, img); err != nil {
		t.Fatalf("restore from a live checkpoint: %v", err)
	}
	log := kid.WaitLog(t, "tick=", 60*time.Second)
	if first := firstTick(log); first < 3 {
		t.Errorf("the child's first tick is %d; the source had passed 3 at the checkpoint", first)
	}

	// A stopped container is refused, as a precondition (the live path
	// leaves that check to runsc), and so is a deleted one.
	kst, err := rt.State(ctx, kid.ID)
	if err != nil {
		t.Fatal(err)
	}
	if err := rt.Kill(ctx, kid.ID, syscall.SIGKILL, true); err != nil {
		t.Fatal(err)
	}
	if err := waitExited(ctx, kst.Pid, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	// runsc says stopped once the dead sandbox is reaped (a zombie still
	// answers kill 0).
	for deadline := time.Now().Add(30 * time.Second); ; {
		st, err := rt.State(ctx, kid.ID)
		if err != nil {
			t.Fatal(err)
		}
		if st.Status == runtime.StatusStopped {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("killed container still %s after 30 s", st.Status)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := rt.CheckpointLive(ctx, kid.ID, filepath.Join(tmp, "image3")); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("live checkpoint of a stopped container: got %v, want FailedPrecondition", err)
	}
	if ents, _ := os.ReadDir(filepath.Join(tmp, "image3")); len(ents) != 0 {
		t.Errorf("a refused live checkpoint left %d files in its image dir", len(ents))
	}
	if err := rt.Delete(ctx, kid.ID, true); err != nil {
		t.Fatal(err)
	}
	if err := rt.CheckpointLive(ctx, kid.ID, filepath.Join(tmp, "image4")); !errdefs.IsNotFound(err) {
		t.Errorf("live checkpoint of a deleted container: got %v, want NotFound", err)
	}
}
