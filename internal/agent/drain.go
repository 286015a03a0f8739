package agent

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// maxBuffered bounds the bytes drainBuffered takes once a read deadline
// passed: a pipe holds at most pipe-max-size (1 MiB by default), so this
// is everything an exited process left, and a descendant that keeps
// writing cannot hold the drain open.
const maxBuffered = 1 << 20

// readUntil reads r into buf and hands each chunk to emit until EOF, an
// error, or r's read deadline. A passed deadline makes Go fail every later
// read without looking at the descriptor, so output an exited process wrote
// before it exited would be lost whenever the reader had not been scheduled
// in time (a loaded host, a busy Sentry): at the deadline, readUntil takes
// what the descriptor holds without waiting (drainBuffered). It returns the
// error that ended the loop.
func readUntil(r *os.File, buf []byte, emit func([]byte)) error {
	for {
		n, err := r.Read(buf)
		if n > 0 {
			emit(buf[:n])
		}
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				drainBuffered(r, buf, emit)
			}
			return err
		}
	}
}

// drainBuffered hands emit what r holds now, at most maxBuffered bytes,
// with non-blocking reads (Go's descriptors for pipes and terminals are
// non-blocking) that ignore r's read deadline.
func drainBuffered(r *os.File, buf []byte, emit func([]byte)) {
	rc, err := r.SyscallConn()
	if err != nil {
		return
	}
	_ = rc.Control(func(fd uintptr) {
		for total := 0; total < maxBuffered; {
			n, err := unix.Read(int(fd), buf[:min(len(buf), maxBuffered-total)])
			if n > 0 {
				emit(buf[:n])
				total += n
				continue
			}
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return // EAGAIN (empty), EOF (n == 0), EIO (a terminal's master), or another error
		}
	})
}
