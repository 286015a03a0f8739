package runsc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
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
		// runsc says paused while held: a command killed now leaves a
		// container that runsc resume takes.
		if st, err := rt.State(ctx, src.ID); err != nil || st.Status != runtime.StatusPaused {
			return fmt.Errorf("runsc state while held: %+v, %v; want paused", st, err)
		}
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

	// The command killed while it holds the source (as a daemon stopped
	// with its whole cgroup would have it): runsc says paused, and runsc
	// resume takes it.
	h, err = rt.CheckpointHeld(ctx, src.ID, filepath.Join(tmp, "image4"), func(time.Time) error {
		return killHoldCommand(src.ID)
	})
	if err == nil || !h.Paused || !h.Saved || h.Resumed {
		t.Fatalf("a hold whose command was killed: %+v, %v; want an error, paused, saved, not resumed", h, err)
	}
	if st, err := rt.State(ctx, src.ID); err != nil || st.Status != runtime.StatusPaused {
		t.Fatalf("after the hold's command was killed: %+v, %v; want paused", st, err)
	}
	if err := rt.Resume(ctx, src.ID); err != nil {
		t.Fatalf("runsc resume after the hold's command was killed: %v", err)
	}
	n = lastInt(counter)
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
	// A runsc whose help lists the stock checkpoint flags only.
	rt, _, img := fakeRunsc(t, "#!/bin/sh\necho '  -image-path string'\necho '  -leave-running'\n")
	called := false
	h, err := rt.CheckpointHeld(context.Background(), "fbx-stock", img, func(time.Time) error { called = true; return nil })
	if !errdefs.IsNotImplemented(err) || h != (runtime.Hold{}) || called {
		t.Fatalf("stock runsc: %+v, %v (held called: %v); want NotImplemented and nothing done", h, err, called)
	}
	if _, err := os.Stat(img); !os.IsNotExist(err) {
		t.Errorf("the image dir was made: %v", err)
	}
}

// fakeHoldRunsc is a runsc whose help lists --hold-fd and whose checkpoint
// plays the command's side of the hold protocol as $FAKE_HOLD says.
const fakeHoldRunsc = `#!/bin/sh
if [ "$1" = help ]; then echo '  -hold-fd int'; exit 0; fi
img=
prev=
for a in "$@"; do [ "$prev" = --image-path ] && img=$a; prev=$a; done
case "$FAKE_HOLD" in
noflag) echo 'flag provided but not defined: -hold-fd' >&2; exit 2 ;;
fail) echo 'loading container: container "x" does not exist' >&2; exit 1 ;;
a-exit) printf a >&3; exit 1 ;;
a-stuck) printf a >&3; exec sleep 60 ;;
save-fail) printf ap >&3; printf r >&3; echo 'checkpoint failed: boom' >&2; exit 1 ;;
no-image) printf aps >&3; head -c1 <&3 >/dev/null; printf r >&3 ;;
ok) printf ap >&3; touch "$img/checkpoint.img"; printf s >&3; head -c1 <&3 >/dev/null; printf r >&3 ;;
timeout) printf ap >&3; touch "$img/checkpoint.img"; printf s >&3; printf T >&3 ;;
resume-fail) printf ap >&3; touch "$img/checkpoint.img"; printf s >&3; head -c1 <&3 >/dev/null; echo 'resuming container: boom' >&2; exit 1 ;;
esac
`

// TestCheckpointHeldProtocol: every way the command can end, against a
// fake runsc playing its side of the protocol: what CheckpointHeld reports
// (whether the sandbox may stand still, was saved, runs again), whether it
// called held, and the error's class.
func TestCheckpointHeldProtocol(t *testing.T) {
	step := holdStep
	holdStep = 300 * time.Millisecond // a-stuck never says 'p'
	t.Cleanup(func() { holdStep = step })
	for _, tc := range []struct {
		play       string
		hold       runtime.Hold // Paused, Saved, Resumed (durations not compared)
		held       bool
		class      func(error) bool
		imageAfter bool
	}{
		{"ok", runtime.Hold{Paused: true, Saved: true, Resumed: true}, true, nil, true},
		{"noflag", runtime.Hold{}, false, errdefs.IsNotImplemented, false},
		{"fail", runtime.Hold{}, false, errdefs.IsNotFound, false},
		{"a-exit", runtime.Hold{Paused: true}, false, isInternal, false},
		{"a-stuck", runtime.Hold{Paused: true}, false, errdefs.IsDeadlineExceeded, false},
		{"save-fail", runtime.Hold{Paused: true, Resumed: true}, false, isInternal, false},
		{"no-image", runtime.Hold{Paused: true, Saved: true, Resumed: true}, false, isInternal, true},
		{"timeout", runtime.Hold{Paused: true, Saved: true, Resumed: true}, true, isInternal, true},
		{"resume-fail", runtime.Hold{Paused: true, Saved: true}, true, isInternal, true},
	} {
		t.Run(tc.play, func(t *testing.T) {
			t.Setenv("FAKE_HOLD", tc.play)
			rt, bin, img := fakeRunsc(t, fakeHoldRunsc)
			called := false
			h, err := rt.CheckpointHeld(context.Background(), "fbx-fake", img, func(time.Time) error { called = true; return nil })
			got := runtime.Hold{Paused: h.Paused, Saved: h.Saved, Resumed: h.Resumed}
			if got != tc.hold || called != tc.held {
				t.Errorf("hold %+v, held called %v; want %+v, %v (err %v)", got, called, tc.hold, tc.held, err)
			}
			switch {
			case tc.class == nil && err != nil:
				t.Errorf("err %v, want none", err)
			case tc.class != nil && !tc.class(err):
				t.Errorf("err %v: wrong class", err)
			}
			if _, serr := os.Stat(img); (serr == nil) != tc.imageAfter {
				t.Errorf("image dir there: %v, want %v", serr == nil, tc.imageAfter)
			}
			if tc.play == "noflag" {
				if _, ok := holdSupport.Load(bin); ok {
					t.Errorf("a runsc that refused --hold-fd is still taken to have it")
				}
			}
		})
	}
}

func isInternal(err error) bool { return errors.Is(err, errdefs.ErrInternal) }

// killHoldCommand SIGKILLs the runsc checkpoint --hold-fd command of
// container id.
func killHoldCommand(id string) error {
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return err
	}
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", p.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if slices.Contains(args, "--hold-fd") && args[len(args)-1] == id {
			return syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	return fmt.Errorf("no hold command of %s", id)
}

// fakeRunsc is a driver for the runsc script in a temp dir: it returns the
// driver, the script's path and an image dir path (not made).
func fakeRunsc(t *testing.T, script string) (*Runsc, string, string) {
	t.Helper()
	tmp := t.TempDir()
	bin := filepath.Join(tmp, "runsc")
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	rt, err := New(Options{Binary: bin, Root: filepath.Join(tmp, "state")})
	if err != nil {
		t.Fatal(err)
	}
	return rt, bin, filepath.Join(tmp, "image")
}
