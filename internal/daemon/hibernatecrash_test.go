package daemon

import (
	"context"
	"os/exec"
	"testing"
	"time"
)

func TestProcessState(t *testing.T) {
	for stat, want := range map[string]byte{
		"123 (sh) S 1 2 3":          'S',
		"123 (a) b) Z 1 2":          'Z',
		"123 (x)) R 1":              'R',
		"123 (cut":                  0,
		"123 (cut)":                 0,
		"4194304 (runsc-sandbox) D": 'D',
	} {
		if got := processState([]byte(stat)); got != want {
			t.Errorf("processState(%q) = %q, want %q", stat, got, want)
		}
	}
}

// pidExits takes a zombie (runsc reports an unreaped sandbox as running)
// and a gone process as exited, and a live one not.
func TestPidExits(t *testing.T) {
	ctx := context.Background()
	cmd := exec.Command("sleep", "1000")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	if pidExits(ctx, pid, 0) {
		t.Error("a sleeping process taken as exited")
	}
	cmd.Process.Kill()
	if !pidExits(ctx, pid, time.Minute) {
		t.Error("a killed, unreaped process (a zombie) not taken as exited")
	}
	cmd.Wait()
	if !pidExits(ctx, pid, 0) {
		t.Error("a reaped process not taken as exited")
	}
	if !pidExits(ctx, 0, 0) {
		t.Error("pid 0 not taken as exited")
	}
}
