package runsc

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/forkbox/forkbox/internal/runtime/spec"
)

// A `runsc run` killed part-way (as a crashed daemon's Pdeathsig kills it)
// may leave its lock file and control socket in the state root before or
// after it writes the container's state; either way Delete leaves the root
// empty. The kill lands once the lock file exists (a condition, not a
// delay), so some runs cut the CLI before the state file and some after:
// the assertion holds for both. The container is in a state root of its
// own, or in the flat root a daemon before per-sandbox roots used.
func TestDeleteForgetsRunCutShort(t *testing.T) {
	for i := 0; i < 4; i++ {
		f := newFixture(t, Options{}, spec.SpecOptions{Args: []string{"/bin/sleep", "1000"}})
		root := f.rt.Root()
		if i%2 == 0 {
			var err error
			if root, err = f.rt.makeRoot(f.ID, f.Bundle); err != nil {
				t.Fatal(err)
			}
		}
		cmd := exec.Command(f.rt.opts.Binary, append(f.rt.globalArgs(root, ""), "run", "--detach", "--bundle", f.Bundle, f.ID)...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		lock := filepath.Join(root, f.ID+"_sandbox:"+f.ID+".lock")
		deadline := time.Now().Add(time.Minute)
		for {
			if _, err := os.Stat(lock); err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("runsc run wrote no lock file %s within a minute", lock)
			}
			time.Sleep(time.Millisecond) // polling a file runsc writes; no other signal exists
		}
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		cmd.Wait()
		if err := f.rt.Delete(context.Background(), f.ID, true); err != nil {
			t.Fatalf("delete after a cut-short run: %v", err)
		}
		left, _ := os.ReadDir(f.rt.Root())
		var names []string
		for _, e := range left {
			names = append(names, e.Name())
		}
		if len(names) != 0 {
			t.Errorf("run %d: state root after delete holds %s", i, strings.Join(names, ", "))
		}
	}
}

// runsc writes a container's state file beside it and renames it into
// place (scripts/gvisor/state-atomic.patch): a save that cannot complete
// leaves the state that was there, which later commands load. Stock runsc
// truncates the file before it writes: one killed in between (its daemon
// killed during a wake, in the chaos test) left a file that no command,
// delete included, could load, and the sandbox failed. Here the save fails
// for sure: a directory stands where the new state is written.
func TestFailedStateSaveKeepsState(t *testing.T) {
	f := newFixture(t, Options{}, spec.SpecOptions{Args: []string{"/bin/sleep", "1000"}})
	ctx := context.Background()
	root, err := f.rt.makeRoot(f.ID, f.Bundle)
	if err != nil {
		t.Fatal(err)
	}
	runsc := func(args ...string) (string, error) {
		// Output to a file: the sandbox keeps the CLI's stdio open.
		out, err := os.CreateTemp(t.TempDir(), "out")
		if err != nil {
			t.Fatal(err)
		}
		defer out.Close()
		cmd := exec.Command(f.rt.opts.Binary, append(f.rt.globalArgs(root, ""), args...)...)
		cmd.Stdout, cmd.Stderr = out, out
		err = cmd.Run()
		b, _ := os.ReadFile(out.Name())
		return string(b), err
	}
	if out, err := runsc("create", "--bundle", f.Bundle, f.ID); err != nil {
		t.Fatalf("runsc create: %v: %s", err, out)
	}
	t.Cleanup(func() { f.rt.Delete(context.Background(), f.ID, true) })
	before, err := f.rt.State(ctx, f.ID)
	if err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(root, f.ID+"_sandbox:"+f.ID+".state.tmp")
	if err := os.Mkdir(tmp, 0o700); err != nil {
		t.Fatal(err)
	}
	out, err := runsc("start", f.ID)
	if err == nil || !strings.Contains(out, "writing json file") {
		t.Fatalf("runsc start with its new state unwritable: %v: %s; want a failed save (is runsc built with state-atomic.patch? make setup)", err, out)
	}
	after, err := f.rt.State(ctx, f.ID)
	if err != nil {
		t.Fatalf("the state after a failed save does not load: %v", err)
	}
	if after.Status != before.Status {
		t.Errorf("state after a failed save: %s, want %s (the state before it)", after.Status, before.Status)
	}
	if err := os.Remove(tmp); err != nil {
		t.Fatal(err)
	}
	if err := f.rt.Delete(ctx, f.ID, true); err != nil {
		t.Fatalf("delete: %v", err)
	}
	if left, _ := os.ReadDir(f.rt.Root()); len(left) != 0 {
		t.Errorf("state root after delete holds %d entries", len(left))
	}
}
