package agent

import (
	"bytes"
	"errors"
	"os"
	"testing"
	"time"
)

// Output an exited process left in its pipe reaches the client even when
// the reader was not scheduled before the drain deadline passed (CI once
// lost an `echo`'s output this way under load): the deadline is set in the
// past before the first read, with the write end still open as a
// descendant would hold it.
func TestReadUntilAfterDeadline(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	if _, err := w.Write([]byte("188\n")); err != nil {
		t.Fatal(err)
	}
	r.SetReadDeadline(time.Now().Add(-time.Second))
	var got bytes.Buffer
	err = readUntil(r, make([]byte, chunkSize), func(p []byte) { got.Write(p) })
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("readUntil: %v, want a deadline error", err)
	}
	if got.String() != "188\n" {
		t.Errorf("read %q after the deadline, want %q", got.String(), "188\n")
	}
}

// A descendant that keeps writing cannot hold the drain open: after the
// deadline, readUntil takes at most maxBuffered bytes and returns. Here the
// writer refills the pipe with every chunk read, so it is never empty; past
// 4*maxBuffered it stops, so a drain without its bound ends too and fails.
func TestReadUntilBoundedAfterDeadline(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	if _, err := w.Write(bytes.Repeat([]byte("x"), 4096)); err != nil {
		t.Fatal(err)
	}
	r.SetReadDeadline(time.Now().Add(-time.Second))
	total := 0
	err = readUntil(r, make([]byte, chunkSize), func(p []byte) {
		total += len(p)
		if total <= 4*maxBuffered {
			w.Write(p) // room for it: p was just read
		}
	})
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("readUntil: %v, want a deadline error", err)
	}
	if total > maxBuffered {
		t.Errorf("read %d bytes after the deadline, bound %d", total, maxBuffered)
	}
}
