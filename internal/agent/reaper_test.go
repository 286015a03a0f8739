package agent

import (
	"context"
	"log/slog"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// TestReaperWakesOnlyForChildren: the reaper reaps a child when its SIGCHLD
// comes, and makes no pass while no child exits (no tick: idle gVisor
// sandboxes paid a host CPU wakeup per second for one). The quiet window is
// an observation, not a synchronisation: a loaded host can only delay a
// pass, never make one, so load cannot fail this test.
func TestReaperWakesOnlyForChildren(t *testing.T) {
	r := newReaper(false, slog.New(slog.DiscardHandler))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	spawnTrue := func() <-chan syscall.WaitStatus {
		t.Helper()
		_, ch, err := r.spawn(func() (int, error) {
			cmd := exec.Command("true")
			if err := cmd.Start(); err != nil {
				return 0, err
			}
			return cmd.Process.Pid, nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return ch
	}
	wait := func(ch <-chan syscall.WaitStatus) {
		t.Helper()
		select {
		case ws := <-ch:
			if ws.ExitStatus() != 0 {
				t.Fatalf("true exited %d", ws.ExitStatus())
			}
		case <-time.After(time.Minute):
			t.Fatal("a child's exit was not reaped within a minute")
		}
	}
	wait(spawnTrue())

	// One pass may follow: a SIGCHLD that came just before the pass that
	// reaped its child is still in the channel. A tick would make three.
	before := r.passes.Load()
	time.Sleep(3500 * time.Millisecond) // the observation window
	if n := r.passes.Load() - before; n > 1 {
		t.Fatalf("%d reap passes in 3.5 s with no child exiting; want at most 1 (a timer wakes the agent)", n)
	}
	// Still woken by the next child's SIGCHLD alone.
	wait(spawnTrue())
}
