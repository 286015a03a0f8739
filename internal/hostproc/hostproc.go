// Package hostproc tells whether host processes have exited: gone from
// /proc, or zombies that nobody has reaped yet. A runtime still reports a
// sandbox whose process is a zombie as running (runsc asks kill(pid, 0)),
// and its state file can name a process long gone.
package hostproc

import (
	"bytes"
	"context"
	"os"
	"strconv"
	"time"
)

// Exited reports whether host process pid has exited (gone, or a zombie);
// pid 0 or below has.
func Exited(pid int) bool {
	if pid <= 0 {
		return true
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	return err != nil || state(b) == 'Z'
}

// WaitExited waits until host process pid has exited, at most for timeout
// (0: looks once); false when it still runs then, or ctx ended first.
func WaitExited(ctx context.Context, pid int, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for !Exited(pid) {
		if !time.Now().Before(deadline) {
			return false
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(5 * time.Millisecond): // polling a condition, with a deadline
		}
	}
	return true
}

// state is the state letter of a /proc/<pid>/stat line: "pid (comm) S
// ...", after the last ')' (the command may itself hold one); 0 when the
// line is cut short.
func state(stat []byte) byte {
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 || i+2 >= len(stat) {
		return 0
	}
	return stat[i+2]
}
