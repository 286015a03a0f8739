package storage

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/errdefs"
)

// holdLock starts another process that holds path's flock and returns it
// once the lock is taken (seen from here: a non-blocking flock fails) and
// flock(1) has started sleep, which shares it: both are its holders.
func holdLock(t *testing.T, path string) *exec.Cmd {
	t.Helper()
	// flock(1) holds it for its child: the lock is the process group's.
	cmd := exec.Command("flock", "-x", path, "sleep", "600")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Skipf("flock(1): %v", err)
	}
	t.Cleanup(func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); cmd.Wait() })
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	held := func() bool {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			unix.Flock(int(f.Fd()), unix.LOCK_UN)
		}
		return errors.Is(err, unix.EWOULDBLOCK)
	}
	// flock(1) forks after taking the lock; its child is sleep once it
	// has exec'd (with the lock's file inherited).
	sleeping := func() bool {
		kids, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", cmd.Process.Pid, cmd.Process.Pid))
		for _, kid := range strings.Fields(string(kids)) {
			if comm, _ := os.ReadFile("/proc/" + kid + "/comm"); strings.TrimSpace(string(comm)) == "sleep" {
				return true
			}
		}
		return false
	}
	for deadline := time.Now().Add(30 * time.Second); !held() || !sleeping(); {
		if time.Now().After(deadline) {
			t.Fatalf("flock(1) (PID %d): after 30s, lock held %v, sleep started %v", cmd.Process.Pid, held(), sleeping())
		}
		time.Sleep(10 * time.Millisecond) // polling another process's start, with a bound against a hang
	}
	return cmd
}

// A root locked by a live process is refused once the wait is over,
// naming the holder; a holder that lets go within the wait (a daemon
// just killed, restarted at once) is waited for.
func TestLockRootWaitsThenNamesHolder(t *testing.T) {
	path := filepath.Join(t.TempDir(), "lock")
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := holdLock(t, path)
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()

	old := lockWait
	lockWait = 200 * time.Millisecond
	err = lockRoot(context.Background(), f, "/root-x")
	lockWait = old
	if !errdefs.IsUnavailable(err) || !strings.Contains(err.Error(), fmt.Sprintf("PID %d flock", cmd.Process.Pid)) ||
		!strings.Contains(err.Error(), " sleep") || !strings.Contains(err.Error(), "/root-x") {
		t.Fatalf("locked root: %v; want Unavailable naming the root and its holders, flock (PID %d) and its sleep", err, cmd.Process.Pid)
	}

	// A wait that only bounds a hang: the holders are killed at once.
	lockWait = 30 * time.Second
	defer func() { lockWait = old }()
	done := make(chan error, 1)
	go func() { done <- lockRoot(context.Background(), f, "/root-x") }()
	if err := syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	if err := <-done; err != nil {
		t.Fatalf("lock after its holder died: %v", err)
	}
}
