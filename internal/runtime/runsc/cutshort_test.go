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
