package storage

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/errdefs"
)

// lockWait bounds how long Open waits for another holder of the root's
// lock. The holder is normally a process just killed (a crash and an
// immediate restart, as a supervisor does): the kernel may release its
// lock a moment after it is reaped, e.g. a file put by a child that was
// between fork and exec when it died. A live second daemon keeps it and
// is refused, with its PID.
var lockWait = 10 * time.Second

// lockRoot takes the exclusive flock of f, waiting up to lockWait (and
// ctx) for a holder to let go.
func lockRoot(ctx context.Context, f *os.File, root string) error {
	deadline := time.Now().Add(lockWait)
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			return fmt.Errorf("lock snapshot root %s: %v: %w", root, err, errdefs.ErrInternal)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("snapshot root %s is in use by another process%s: %w", root, holder(f), errdefs.ErrUnavailable)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("snapshot root %s is in use by another process%s: %w", root, holder(f), errdefs.ErrUnavailable)
		case <-time.After(50 * time.Millisecond): // polling the kernel's lock, with a deadline
		}
	}
}

// holder names the processes that have f's file open (the flock's
// holder among them: the one that took it, from /proc/locks, may have
// exited and left it to a child), "" if it cannot tell.
func holder(f *os.File) string {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return ""
	}
	self := strconv.Itoa(os.Getpid())
	procs, _ := filepath.Glob("/proc/[0-9]*/fd/*")
	var names []string
	seen := map[string]bool{}
	for _, fd := range procs {
		pid := strings.Split(fd, "/")[2]
		if pid == self || seen[pid] {
			continue
		}
		var fst unix.Stat_t
		if unix.Stat(fd, &fst) != nil || fst.Dev != st.Dev || fst.Ino != st.Ino {
			continue
		}
		seen[pid] = true
		comm, _ := os.ReadFile("/proc/" + pid + "/comm")
		names = append(names, fmt.Sprintf("PID %s %s", pid, strings.TrimSpace(string(comm))))
		if len(names) == 4 {
			break
		}
	}
	if len(names) == 0 {
		return ""
	}
	return " (" + strings.Join(names, ", ") + ")"
}
