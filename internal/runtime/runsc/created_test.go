package runsc

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/runtime"
	"github.com/forkbox/forkbox/internal/runtime/testsuite"
)

// TestRestoreIntoCreated: a container created ahead (booted, no code run)
// takes a memory image of a source with the same spec and continues its
// processes; it is restored once only; a created container whose restore
// fails is deleted; an unknown one is NotFound.
func TestRestoreIntoCreated(t *testing.T) {
	g := newMFRig(t)
	rt, tmp, lower, args := g.rt, g.tmp, g.lower, g.args
	ctx := context.Background()
	srcDir, src := g.source(t, "fbx-src")
	img := filepath.Join(tmp, "image")
	if err := rt.Checkpoint(ctx, src.ID, img); err != nil {
		t.Fatalf("checkpoint: %v", err)
	}

	// Created ahead from a copy of the source's files: booted, nothing
	// run (the script prints a tick first thing).
	kidDir := g.childDir(t, srcDir, "kid")
	kid := mfBundle(t, rt, kidDir, mfOverlay(t, lower, kidDir), "fbx-kid", testsuite.Netns(t), args)
	if err := rt.Create(ctx, kid.ID, kid.Bundle); err != nil {
		t.Fatalf("create: %v", err)
	}
	if st, err := rt.State(ctx, kid.ID); err != nil || st.Status != runtime.StatusCreated || st.Pid <= 0 {
		t.Fatalf("after create: %+v, %v; want created with a sandbox pid", st, err)
	}
	if err := rt.Create(ctx, kid.ID, kid.Bundle); !errdefs.IsAlreadyExists(err) {
		t.Errorf("a second create: got %v, want AlreadyExists", err)
	}
	if b, _ := os.ReadFile(filepath.Join(kid.Bundle, "stdio.log")); strings.Contains(string(b), "tick=") {
		t.Fatalf("a created container ran its process:\n%s", b)
	}

	if err := rt.RestoreCreated(ctx, kid.ID, kid.Bundle, img); err != nil {
		t.Fatalf("restore into the created container: %v", err)
	}
	log := kid.WaitLog(t, "tick=", 60*time.Second)
	if first := firstTick(log); first < 3 {
		t.Errorf("the restored container's first tick is %d; the source had passed 3 at the checkpoint", first)
	}
	st, err := rt.State(ctx, kid.ID)
	if err != nil || st.Status != runtime.StatusRunning {
		t.Fatalf("after the restore: %+v, %v; want running", st, err)
	}
	if err := rt.RestoreCreated(ctx, kid.ID, kid.Bundle, img); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("a second restore into the same container: got %v, want FailedPrecondition", err)
	}
	if err := rt.Kill(ctx, kid.ID, syscall.SIGKILL, true); err != nil {
		t.Fatal(err)
	}
	if err := rt.Delete(ctx, kid.ID, true); err != nil {
		t.Fatal(err)
	}
	if err := rt.RestoreCreated(ctx, kid.ID, kid.Bundle, img); !errdefs.IsNotFound(err) {
		t.Errorf("restore into a deleted container: got %v, want NotFound", err)
	}

	// A container created with other args cannot take the image (runsc
	// validates the spec): FailedPrecondition, and it is gone.
	otherDir := g.childDir(t, srcDir, "other")
	other := mfBundle(t, rt, otherDir, mfOverlay(t, lower, otherDir), "fbx-other", testsuite.Netns(t), []string{"/bin/sleep", "1000"})
	if err := rt.Create(ctx, other.ID, other.Bundle); err != nil {
		t.Fatalf("create: %v", err)
	}
	if err := rt.RestoreCreated(ctx, other.ID, other.Bundle, img); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("restore into a container of another spec: got %v, want FailedPrecondition", err)
	}
	if _, err := rt.State(ctx, other.ID); !errdefs.IsNotFound(err) {
		t.Errorf("after its failed restore the created container is still known: %v", err)
	}
}
