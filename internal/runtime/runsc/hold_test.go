package runsc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/runtime"
	"github.com/forkbox/forkbox/internal/runtime/testsuite"
)

// TestCheckpointHeld: a held checkpoint stands the container still from
// before its save until held returns (its counter, rewritten every 50 ms,
// does not move), then it runs on, still running in runsc's state with the
// same sandbox process; a child restored from the image over the writable
// layer copied while held continues from that count. A held that fails is
// returned and the container runs on; a paused container is refused and
// left paused.
func TestCheckpointHeld(t *testing.T) {
	g := newMFRig(t)
	rt, tmp, lower, args := g.rt, g.tmp, g.lower, g.args
	ctx := context.Background()
	srcDir, src := g.source(t, "fbx-held")
	before, err := rt.State(ctx, src.ID)
	if err != nil {
		t.Fatal(err)
	}
	counter := filepath.Join(srcDir, "upper", "root", "counter")
	img := filepath.Join(tmp, "image")
	const window = 300 * time.Millisecond
	var atSave int
	var kidDir string
	h, err := rt.CheckpointHeld(ctx, src.ID, img, func(time.Time) error {
		atSave = lastInt(counter)
		// An observation window, not a wait for an outcome: running, the
		// source would rewrite its counter about 6 times in it.
		time.Sleep(window)
		if n := lastInt(counter); n != atSave {
			return fmt.Errorf("the counter moved from %d to %d while held", atSave, n)
		}
		kidDir = g.childDir(t, srcDir, "kid") // as the daemon snapshots it
		return nil
	})
	if err != nil {
		t.Fatalf("held checkpoint: %v", err)
	}
	if !h.Saved || !h.Resumed || h.Stood < window || h.Save <= 0 || h.Save > h.Stood {
		t.Errorf("held checkpoint: %+v; want saved, resumed, stood at least %s", h, window)
	}
	if _, err := os.Stat(filepath.Join(img, CheckpointImageFile)); err != nil {
		t.Errorf("no image: %v", err)
	}
	if st, err := rt.State(ctx, src.ID); err != nil || st.Status != runtime.StatusRunning || st.Pid != before.Pid {
		t.Fatalf("after a held checkpoint: %+v, %v; want running with pid %d", st, err, before.Pid)
	}
	src.WaitLog(t, fmt.Sprintf("tick=%d ", atSave+3), 60*time.Second)

	kid := mfBundle(t, rt, kidDir, mfOverlay(t, lower, kidDir), "fbx-held-kid", testsuite.Netns(t), args)
	if err := rt.Restore(ctx, kid.ID, kid.Bundle, img); err != nil {
		t.Fatalf("restore from a held checkpoint: %v", err)
	}
	// The shell was stopped between two ticks: the child prints the tick it
	// had written last, or the next.
	if first := firstTick(kid.WaitLog(t, "tick=", 60*time.Second)); first < atSave || first > atSave+1 {
		t.Errorf("the child's first tick is %d; the source stood at %d", first, atSave)
	}

	// held's error is returned; the container runs on.
	boom := errors.New("boom")
	h, err = rt.CheckpointHeld(ctx, src.ID, filepath.Join(tmp, "image2"), func(time.Time) error { return boom })
	if !errors.Is(err, boom) || !h.Resumed {
		t.Fatalf("a held that fails: %+v, %v; want boom, resumed", h, err)
	}
	n := lastInt(counter)
	src.WaitLog(t, fmt.Sprintf("tick=%d ", n+3), 60*time.Second)

	// A paused container is refused, and stays paused.
	if err := rt.Pause(ctx, src.ID); err != nil {
		t.Fatal(err)
	}
	called := false
	_, err = rt.CheckpointHeld(ctx, src.ID, filepath.Join(tmp, "image3"), func(time.Time) error { called = true; return nil })
	if !errdefs.IsFailedPrecondition(err) || called {
		t.Errorf("held checkpoint of a paused container: %v (held called: %v); want FailedPrecondition", err, called)
	}
	if ents, _ := os.ReadDir(filepath.Join(tmp, "image3")); len(ents) != 0 {
		t.Errorf("a refused held checkpoint left %d files in its image dir", len(ents))
	}
	if st, err := rt.State(ctx, src.ID); err != nil || st.Status != runtime.StatusPaused {
		t.Errorf("after a refused held checkpoint: %+v, %v; want paused", st, err)
	}
}

// TestCheckpointHeldUnsupported: a runsc without --hold-fd (a stock build)
// is NotImplemented before anything is done, so the caller can take the
// checkpoint the other way.
func TestCheckpointHeldUnsupported(t *testing.T) {
	tmp := t.TempDir()
	bin := filepath.Join(tmp, "runsc")
	// A runsc whose help lists the stock checkpoint flags only.
	script := "#!/bin/sh\necho '  -image-path string'\necho '  -leave-running'\n"
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	rt, err := New(Options{Binary: bin, Root: filepath.Join(tmp, "state")})
	if err != nil {
		t.Fatal(err)
	}
	img := filepath.Join(tmp, "image")
	called := false
	h, err := rt.CheckpointHeld(context.Background(), "fbx-stock", img, func(time.Time) error { called = true; return nil })
	if !errdefs.IsNotImplemented(err) || h != (runtime.Hold{}) || called {
		t.Fatalf("stock runsc: %+v, %v (held called: %v); want NotImplemented and nothing done", h, err, called)
	}
	if _, err := os.Stat(img); !os.IsNotExist(err) {
		t.Errorf("the image dir was made: %v", err)
	}
}
