package hostproc

import (
	"context"
	"os"
	"os/exec"
	"testing"
	"time"
)

func TestState(t *testing.T) {
	for stat, want := range map[string]byte{
		"123 (sh) S 1 2 3":          'S',
		"123 (a) b) Z 1 2":          'Z',
		"123 (x)) R 1":              'R',
		"123 (cut":                  0,
		"123 (cut)":                 0,
		"4194304 (runsc-sandbox) D": 'D',
	} {
		if got := state([]byte(stat)); got != want {
			t.Errorf("state(%q) = %q, want %q", stat, got, want)
		}
	}
}

// A zombie (a runtime reports an unreaped sandbox as running) and a gone
// process have exited; a live one, this one included, has not.
func TestExited(t *testing.T) {
	ctx := context.Background()
	cmd := exec.Command("sleep", "1000")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	if Exited(pid) || WaitExited(ctx, pid, 0) || Exited(os.Getpid()) {
		t.Error("a running process taken as exited")
	}
	cmd.Process.Kill()
	if !WaitExited(ctx, pid, time.Minute) {
		t.Error("a killed, unreaped process (a zombie) not taken as exited")
	}
	cmd.Wait()
	if !Exited(pid) || !Exited(0) {
		t.Error("a reaped process, or pid 0, not taken as exited")
	}
}
