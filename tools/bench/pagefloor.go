package main

import (
	"fmt"
	"runtime"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// The page floor of a memory fan-out: what giving each child its own copy
// of the source's resident pages costs the host at the least, whoever
// restores them. A gVisor sandbox keeps all of its memory in one memory
// file of its own (a memfd), so a memory-forked child cannot share its
// source's pages: its restore writes every one of them into new shared
// memory (runsc's page load, with scripts/gvisor/restore-pwrite.patch, in
// pwrites of pageFloorChunk). The floor does the same with nothing around
// it: count memfds of bytes each, written by one writer per host CPU. A
// fan-out cannot end before PageFloor.FloorMS while its children do not
// share pages.
//
// New memory is what costs: on a host that is a virtual machine whose
// balloon hands freed pages back (free page reporting), every page written
// for the first time makes the hypervisor back it, and the same writes to
// pages the guest touched a moment before cost a fraction of that. The
// floor is measured while the fan-out's children are still up, so the
// pages it writes are as new as theirs were.

// pageFloorChunk is one write: runsc's page load reads and writes 256 KiB
// at a time.
const pageFloorChunk = 256 << 10

// PageFloor is the page floor measured beside one fan-out.
type PageFloor struct {
	// Bytes is all the floor wrote: the fan-out's children times the
	// source's resident bytes.
	Bytes   int64   `json:"bytes"`
	Writers int     `json:"writers"`
	WallMS  float64 `json:"wall_ms"`
	// CPUS is the writers' own CPU time (their threads' CPU clocks), seconds.
	CPUS float64 `json:"cpu_s"`
	// FloorMS is CPUS over the host's CPUs: the least wall time in which
	// the host can write those pages, whatever else it does meanwhile.
	FloorMS float64 `json:"floor_ms"`
}

// measurePageFloor writes count memfds of bytes each with one writer per
// CPU, keeps them all until the last is written (as the children keep
// theirs: pages freed meanwhile would be written again at a fraction of
// the cost), and frees them. The memfds are never mapped: a pwrite
// allocates their pages (no fault per page, no zeroing of what is
// overwritten).
func measurePageFloor(count int, bytes int64) (PageFloor, error) {
	writers := runtime.NumCPU()
	f := PageFloor{Bytes: int64(count) * bytes, Writers: writers}
	jobs := make(chan int, count)
	for i := range count {
		jobs <- i
	}
	close(jobs)
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		cpu   time.Duration
		fds   []int
		first error
	)
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	t := time.Now()
	for range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// One thread for the whole writer, so that its CPU clock
			// counts its writes and nothing else.
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			before := threadCPU()
			mine, err := writeMemfds(jobs, bytes)
			used := threadCPU() - before
			mu.Lock()
			defer mu.Unlock()
			cpu += used
			fds = append(fds, mine...)
			if err != nil && first == nil {
				first = err
			}
		}()
	}
	wg.Wait()
	f.WallMS = ms(time.Since(t))
	f.CPUS = cpu.Seconds()
	f.FloorMS = f.CPUS * 1000 / float64(writers)
	return f, first
}

// writeMemfds fills one new memfd of bytes per job, until the jobs run
// out, and returns them open (those it made before an error too).
func writeMemfds(jobs <-chan int, bytes int64) ([]int, error) {
	buf := make([]byte, pageFloorChunk)
	for i := range buf {
		buf[i] = byte(i*7 + 1) // not zero: a page of zeroes may be a hole
	}
	var fds []int
	for range jobs {
		fd, err := unix.MemfdCreate("forkbox-bench-pagefloor", unix.MFD_CLOEXEC)
		if err != nil {
			return fds, fmt.Errorf("page floor: memfd_create: %w", err)
		}
		fds = append(fds, fd)
		for off := int64(0); off < bytes; off += pageFloorChunk {
			n := min(int64(pageFloorChunk), bytes-off)
			if _, err := unix.Pwrite(fd, buf[:n], off); err != nil {
				return fds, fmt.Errorf("page floor: pwrite at %d: %w", off, err)
			}
		}
	}
	return fds, nil
}

// threadCPU is the calling thread's CPU time (CLOCK_THREAD_CPUTIME_ID:
// exact, where getrusage's thread figures are sampled at the tick).
func threadCPU() time.Duration {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts)
	return time.Duration(ts.Nano())
}
