package agent

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"runtime"
	"sync"
	"syscall"
	"time"
)

// SpareThreads is how many OS threads the agent has the Go runtime start
// early, so that as many of its goroutines can later block in syscalls at
// once without a new thread. Under crun the sandbox's pids cgroup counts the
// agent's threads with the tenant's processes: once a tenant fills it (a
// fork bomb), the kernel refuses every new thread, and a Go runtime that
// needs one more (a goroutine blocked in a syscall while another must run)
// dies with "failed to create new OS thread". Threads made early stay with
// the runtime, idle, and are reused: the agent keeps answering at a full
// cgroup (e2e TestPidsLimitRefusesForkSandboxLives).
const SpareThreads = 8

// reserveWait bounds how long ReserveThreads waits for its goroutines to
// be blocked at once. Each needs a P to reach its read(2), and gets one
// when sysmon hands a blocked one's P off (within 10 ms on an idle host),
// so on a loaded one it can take long. The wait does not hold up serving.
const reserveWait = 30 * time.Second

// ReserveThreads makes the Go runtime start enough OS threads now that n
// goroutines blocked in syscalls at once later need no new one: n plus
// one per P (GOMAXPROCS; while n are blocked, others still run, each on a
// thread, and the runtime may start one more to spin) goroutines block in
// a read(2) at once, each on a thread of its own, until the kernel shows
// them all in that read (/proc/self/task/*/syscall), then are let go. The
// runtime keeps the idle threads and reuses them; idle ones it already
// had count. It returns how many threads the process has.
func ReserveThreads(n int) (int, error) {
	n += runtime.GOMAXPROCS(0)
	if _, err := blockAtOnce(n); err != nil {
		return threadCount(), fmt.Errorf("agent: reserve threads: %w", err)
	}
	return threadCount(), nil
}

// blockAtOnce blocks n goroutines in read(2) on a pipe at once, waits
// until the kernel shows them all in that read, lets them go, and returns
// the process's thread count while they were blocked.
func blockAtOnce(n int) (int, error) {
	var p [2]int
	if err := syscall.Pipe2(p[:], syscall.O_CLOEXEC); err != nil {
		return threadCount(), err
	}
	defer syscall.Close(p[0])
	var wg sync.WaitGroup
	defer wg.Wait()
	// Closing the write end ends the reads, on every path.
	defer syscall.Close(p[1])
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var b [1]byte
			// A raw read: the goroutine keeps its thread while blocked,
			// so the runtime runs the next goroutine on another.
			syscall.Read(p[0], b[:])
		}()
	}
	seen, err := waitReading(p[0], n)
	count := threadCount()
	if err != nil {
		return count, fmt.Errorf("%d of %d seen blocked: %w", seen, n, err)
	}
	return count, nil
}

// waitReading waits, at most reserveWait, until n of this process's
// threads are blocked in read(2) on fd, and returns how many it last saw.
func waitReading(fd, n int) (int, error) {
	deadline := time.Now().Add(reserveWait)
	for {
		got, err := threadsReading(fd)
		if err != nil || got >= n {
			return got, err
		}
		if time.Now().After(deadline) {
			return got, fmt.Errorf("not all blocked after %s", reserveWait)
		}
		time.Sleep(time.Millisecond) // polling the kernel's view: no event exists for it
	}
}

// threadsReading counts this process's threads blocked in read(2) on fd,
// by the syscall and first argument the kernel shows for each.
func threadsReading(fd int) (int, error) {
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return 0, err
	}
	want := fmt.Appendf(nil, "%d 0x%x ", syscall.SYS_READ, fd)
	n := 0
	for _, e := range ents {
		b, err := os.ReadFile("/proc/self/task/" + e.Name() + "/syscall")
		switch {
		case errors.Is(err, fs.ErrNotExist):
			// The thread exited meanwhile.
		case err != nil:
			return n, err
		case bytes.HasPrefix(b, want):
			n++
		}
	}
	return n, nil
}

// threadCount is the number of threads of this process.
func threadCount() int {
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return 0
	}
	return len(ents)
}
