package agent

import (
	"bytes"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// sentryLogSize bounds the kernel log read (the patched sentry keeps 64 KiB).
const sentryLogSize = 128 << 10

// markSentryOOM marks st OOM-killed when its process was SIGKILLed by the
// sentry's OOM killer. A runsc built with scripts/gvisor/memory-limit.patch
// enforces the limit when it allocates and logs each kill to the sandbox's
// kernel log in Linux's words ("Memory cgroup out of memory: Killed process
// PID (comm) ..."); the agent reads it back with syslog(2). Only under gVisor
// (a memory limit given to the agent): under crun the log is the host's.
func (s *Server) markSentryOOM(st *execState, ws syscall.WaitStatus) {
	if s.cfg.MemoryLimit <= 0 || st.oomKilled.Load() || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		return
	}
	buf := make([]byte, sentryLogSize)
	n, err := unix.Klogctl(unix.SYSLOG_ACTION_READ_ALL, buf)
	if err != nil || n <= 0 {
		return
	}
	if sentryKilled(buf[:n], st.pid) {
		st.oomKilled.Store(true)
		s.log.Warn("memory limit exceeded: the sentry killed the process", "pid", st.pid)
	}
}

// sentryKilled reports whether log names pid as killed by the OOM killer.
func sentryKilled(log []byte, pid int) bool {
	needle := []byte("out of memory: Killed process " + strconv.Itoa(pid) + " (")
	return bytes.Contains(log, needle)
}

// memoryEnforcer names who enforces the memory limit, for the agent's log:
// "none", "sentry" or "agent" (the watchdog).
func (s *Server) memoryEnforcer() string {
	switch {
	case s.cfg.MemoryLimit <= 0:
		return "none"
	case s.cfg.SentryEnforcesMemory:
		return "sentry"
	}
	return "agent"
}
