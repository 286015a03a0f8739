package agent

import (
	"fmt"
	"os"
	"sync"
	"syscall"
	"time"
)

// SpareThreads is how many OS threads the agent makes at start beyond what
// the Go runtime has then. Under crun the sandbox's pids cgroup counts the
// agent's threads with the tenant's processes: once a tenant fills it (a
// fork bomb), the kernel refuses every new thread, and a Go runtime that
// needs one more (a goroutine blocked in a syscall while another must run)
// dies with "failed to create new OS thread". Threads made early stay with
// the runtime, idle, and are reused: the agent keeps answering at a full
// cgroup (e2e TestPidsLimitRefusesForkSandboxLives).
const SpareThreads = 8

// reserveWait bounds how long ReserveThreads waits for the runtime to have
// started the threads. It starts one per blocked goroutine, when sysmon
// hands the blocked one's P off (within 10 ms of its syscall on an idle
// host), so on a loaded one it can take long: 2 s was too short once in a
// CI run (5 of 6 threads). The wait does not hold up serving.
const reserveWait = 30 * time.Second

// ReserveThreads makes the Go runtime start about n more OS threads now: n
// goroutines block in a read(2) at once, each holding a thread, until the
// process has n more threads (or reserveWait passes), then are let go. The
// runtime keeps idle threads for later work. It returns how many threads
// the process has.
func ReserveThreads(n int) (int, error) {
	base := threadCount()
	var p [2]int
	if err := syscall.Pipe2(p[:], syscall.O_CLOEXEC); err != nil {
		return base, fmt.Errorf("agent: reserve threads: %w", err)
	}
	defer syscall.Close(p[0])
	defer syscall.Close(p[1])
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var b [1]byte
			// A raw read: the goroutine keeps its thread while blocked,
			// so the runtime starts another for the next goroutine.
			syscall.Read(p[0], b[:])
		}()
	}
	// A condition, bounded: the thread count, read from the kernel.
	deadline := time.Now().Add(reserveWait)
	for threadCount() < base+n && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond) // polling a kernel counter, no event exists for it
	}
	if _, err := syscall.Write(p[1], make([]byte, n)); err != nil {
		return threadCount(), fmt.Errorf("agent: reserve threads: %w", err)
	}
	wg.Wait()
	return threadCount(), nil
}

// threadCount is the number of threads of this process.
func threadCount() int {
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return 0
	}
	return len(ents)
}
