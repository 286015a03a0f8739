package main

import (
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

func TestPageFloor(t *testing.T) {
	open := func() int {
		es, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			t.Fatal(err)
		}
		return len(es)
	}
	before := open()
	// Not a whole number of chunks: the last write is short.
	const bytes = 2*pageFloorChunk + 4097
	f, err := measurePageFloor(5, bytes)
	if err != nil {
		t.Fatal(err)
	}
	if f.Bytes != 5*bytes || f.Writers < 1 {
		t.Errorf("bytes %d writers %d, want %d and at least 1", f.Bytes, f.Writers, 5*bytes)
	}
	if f.WallMS <= 0 || f.CPUS <= 0 {
		t.Errorf("wall %v ms, CPU %v s: both must be measured", f.WallMS, f.CPUS)
	}
	if want := f.CPUS * 1000 / float64(f.Writers); f.FloorMS != want {
		t.Errorf("floor %v ms, want CPU over writers %v", f.FloorMS, want)
	}
	if after := open(); after != before {
		t.Errorf("%d descriptors open after the floor, %d before: the memfds must be closed", after, before)
	}
}

// TestWriteMemfdsSize checks that a memfd gets exactly bytes, the short
// last write included, and that it comes back open.
func TestWriteMemfdsSize(t *testing.T) {
	jobs := make(chan int, 2)
	jobs <- 0
	jobs <- 1
	close(jobs)
	const bytes = pageFloorChunk + 100
	fds, err := writeMemfds(jobs, bytes)
	for _, fd := range fds {
		defer unix.Close(fd)
	}
	if err != nil {
		t.Fatal(err)
	}
	if len(fds) != 2 {
		t.Fatalf("%d memfds, want 2", len(fds))
	}
	for _, fd := range fds {
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			t.Fatal(err)
		}
		if st.Size != bytes {
			t.Errorf("memfd of %d bytes, want %d", st.Size, bytes)
		}
	}
}
