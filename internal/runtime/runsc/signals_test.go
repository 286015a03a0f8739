package runsc

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/internal/runtime"
	"github.com/forkbox/forkbox/internal/runtime/testsuite"
)

// trapScript ticks and prints got-usr1 whenever SIGUSR1 reaches it.
const trapScript = `trap 'echo got-usr1' USR1; i=0; while :; do i=$((i+1)); echo tick=$i; sleep 0.1; done`

// TestSignalForwarded: a signal sent on the host to a running sandbox's
// process reaches the container's init, after a run and after a restore.
// The Sentry registers that forwarding beside the kernel's start rather
// than before it (scripts/gvisor/start-signals.patch), so a signal sent
// at once may come before the registration and be dropped (as one sent
// before the start always was): the test sends it again until init
// reports it.
func TestSignalForwarded(t *testing.T) {
	g := newMFRig(t)
	ctx := context.Background()
	args := []string{"/bin/sh", "-c", trapScript}
	srcDir := filepath.Join(g.tmp, "src")
	src := mfBundle(t, g.rt, srcDir, mfOverlay(t, g.lower, srcDir), "fbx-sig", testsuite.Netns(t), args)
	if err := g.rt.Run(ctx, src.ID, src.Bundle); err != nil {
		t.Fatalf("run: %v", err)
	}
	src.WaitLog(t, "tick=2\n", 60*time.Second)
	signalUntilSeen(t, g.rt, src)

	kid := g.memoryChild(t, src, srcDir, "fbx-sig-kid", args)
	kid.WaitLog(t, "tick=", 60*time.Second)
	signalUntilSeen(t, g.rt, kid)
}

// signalUntilSeen sends SIGUSR1 to f's sandbox process every 100 ms until
// its log says got-usr1 (at most 30 s).
func signalUntilSeen(t *testing.T, rt runtime.Runtime, f *testsuite.Fixture) {
	t.Helper()
	st, err := rt.State(context.Background(), f.ID)
	if err != nil || st.Pid <= 0 {
		t.Fatalf("state of %s: %+v, %v", f.ID, st, err)
	}
	log := filepath.Join(f.Bundle, runtime.LogFileName)
	deadline := time.Now().Add(30 * time.Second)
	for sent := 0; ; sent++ {
		if b, _ := os.ReadFile(log); strings.Contains(string(b), "got-usr1") {
			t.Logf("%s: init saw SIGUSR1 after %d sent", f.ID, sent)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: init never saw SIGUSR1 (%d sent to pid %d)", f.ID, sent, st.Pid)
		}
		if err := unix.Kill(st.Pid, unix.SIGUSR1); err != nil {
			t.Fatalf("signal pid %d: %v", st.Pid, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
