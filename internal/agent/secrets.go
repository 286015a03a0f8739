package agent

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/errdefs"
)

// takeEnv returns the value of the environment variable name and removes
// every copy of it that a tenant could read: it is unset, and in the
// process's original environment block (at the top of the main thread's
// stack: what /proc/<pid>/environ shows) its value is overwritten with NULs
// through /proc/self/mem. The Go runtime keeps copies of its own, which
// Unsetenv drops.
func takeEnv(name string) string {
	val := strings.Clone(os.Getenv(name))
	os.Unsetenv(name)
	if val != "" {
		if err := eraseEnviron(name + "=" + val); err != nil {
			fmt.Fprintf(os.Stderr, "forkbox-agent: erase %s from the environment block: %v\n", name, err)
		}
	}
	return val
}

// environSpan is how much of the top of the stack eraseEnviron reads.
const environSpan = 512 << 10

// eraseEnviron overwrites with NULs the value part of every occurrence of
// the entry kv ("KEY=VALUE") in the main thread's stack mapping.
func eraseEnviron(kv string) error {
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		return err
	}
	var start, end uint64
	for _, l := range strings.Split(string(maps), "\n") {
		if !strings.HasSuffix(l, "[stack]") {
			continue
		}
		r, _, _ := strings.Cut(l, " ")
		a, b, _ := strings.Cut(r, "-")
		start, _ = strconv.ParseUint(a, 16, 64)
		end, _ = strconv.ParseUint(b, 16, 64)
	}
	if end <= start {
		return fmt.Errorf("no [stack] mapping")
	}
	// The environment block sits at the very top: argv, envp and auxv
	// strings, below which the stack grows. The daemon caps a sandbox's
	// environment at 256 KiB, so the top 512 KiB hold it. Reading more is
	// not free: under gVisor every untouched stack page read through
	// /proc/self/mem is faulted in (4 MiB cost every sandbox's start ~50 ms
	// and the agent 4 MiB of memory).
	if end-start > environSpan {
		start = end - environSpan
	}
	mem, err := os.OpenFile("/proc/self/mem", os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer mem.Close()
	buf := make([]byte, end-start)
	n, err := mem.ReadAt(buf, int64(start))
	if n == 0 {
		return fmt.Errorf("read the stack: %v", err)
	}
	buf = buf[:n]
	entry := append([]byte(kv), 0)
	key := len(kv) - len(kv[strings.IndexByte(kv, '=')+1:])
	for off := 0; ; {
		i := bytes.Index(buf[off:], entry)
		if i < 0 {
			break
		}
		at := off + i
		if at == 0 || buf[at-1] == 0 {
			if _, err := mem.WriteAt(make([]byte, len(kv)-key), int64(start)+int64(at+key)); err != nil {
				return err
			}
		}
		off = at + len(entry)
	}
	return nil
}

// hideInit makes the agent non-dumpable when it runs as init: a process
// without CAP_SYS_PTRACE (the tenant's, even as root) can then neither
// ptrace it nor open its /proc/1/{environ,mem,fd/*} (Linux and gVisor both
// check ptrace access there). Children are dumpable again after execve.
func hideInit() error {
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("prctl(PR_SET_DUMPABLE, 0): %v: %w", err, errdefs.ErrInternal)
	}
	return nil
}

// MaxLogBytes bounds what the agent writes to its log (init's stderr, which
// the runtime puts in a file on the host) over its whole life.
const MaxLogBytes = 1 << 20

// CappedWriter passes writes to w until max bytes went through, then writes
// one truncation notice and drops the rest (reporting success, so that
// loggers do not fail). Safe for concurrent use.
type CappedWriter struct {
	mu      sync.Mutex
	w       io.Writer
	left    int64
	noticed bool
}

// NewCappedWriter returns a writer that passes at most max bytes to w.
func NewCappedWriter(w io.Writer, max int64) *CappedWriter {
	return &CappedWriter{w: w, left: max}
}

// Write implements io.Writer.
func (c *CappedWriter) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if int64(len(p)) <= c.left {
		c.left -= int64(len(p))
		_, err := c.w.Write(p)
		return len(p), err
	}
	if !c.noticed {
		c.noticed = true
		c.left = 0
		_, _ = io.WriteString(c.w, "[forkbox-agent: log limit reached, further messages dropped]\n")
	}
	return len(p), nil
}

// StdoutToNull points the process's stdout at /dev/null. The agent as init
// writes nothing to stdout, and what the runtime gave it there is a host
// file.
func StdoutToNull() error {
	f, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	return unix.Dup3(int(f.Fd()), 1, 0)
}
