package runsc

// A standby's process: starting it at a low priority, giving the caller's
// back to all its threads once it waits, and the protocol of
// standby.patch over its socket (handing it a command, reading its bytes).

import (
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// standbyNice is the nice value a standby starts with, so that its exec
// and initialisers yield the CPU to the daemon's own work (nice orders
// processes within one CPU cgroup; a sandbox in a cgroup of its own is
// spared by standbyRefillAfter instead). It gets the caller's priority
// back once it waits (renice), before any command runs in it.
const standbyNice = 19

// start starts a standby with its socket at fd 3, in a process group of its
// own (see cli), at standbyNice: the calling goroutine's locked thread
// takes that nice value for the fork (the child inherits it) and gives it
// back after. tainted reports that it could not give it back.
func (p *standbyPool) start(own int) (conn *net.UnixConn, cmd *exec.Cmd, tainted bool, err error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, false, fmt.Errorf("socket pair: %w", err)
	}
	ours, theirs := os.NewFile(uintptr(fds[0]), "standby"), os.NewFile(uintptr(fds[1]), "standby-runsc")
	defer theirs.Close()
	fc, err := net.FileConn(ours) // a dup: ours is closed below
	ours.Close()
	if err != nil {
		return nil, nil, false, fmt.Errorf("socket: %w", err)
	}
	conn = fc.(*net.UnixConn)
	cmd = exec.Command(p.binary)
	cmd.Env = append(os.Environ(), standbyEnv+"=3")
	cmd.ExtraFiles = []*os.File{theirs}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	tid := unix.Gettid()
	niced := own < standbyNice && unix.Setpriority(unix.PRIO_PROCESS, tid, standbyNice) == nil
	err = cmd.Start()
	if niced && unix.Setpriority(unix.PRIO_PROCESS, tid, own) != nil {
		tainted = true
	}
	if err != nil {
		conn.Close()
		return nil, nil, tainted, err
	}
	return conn, cmd, tainted, nil
}

// threadNice is the calling thread's nice value.
func threadNice() int {
	raw, err := unix.Getpriority(unix.PRIO_PROCESS, unix.Gettid())
	if err != nil {
		return 0
	}
	return 20 - raw // the system call's value is 20 - nice
}

// renice gives every thread of process pid the nice value n (priorities
// are per thread on Linux, and a new thread takes its creator's). It goes
// over the threads until a pass finds none it has not seen.
func renice(pid, n int) error {
	seen := map[string]bool{}
	for {
		tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
		if err != nil {
			return fmt.Errorf("renice: %w", err)
		}
		fresh := false
		for _, t := range tasks {
			if seen[t.Name()] {
				continue
			}
			seen[t.Name()], fresh = true, true
			tid, err := strconv.Atoi(t.Name())
			if err != nil {
				continue
			}
			if err := unix.Setpriority(unix.PRIO_PROCESS, tid, n); err != nil && err != unix.ESRCH {
				return fmt.Errorf("renice thread %d: %w", tid, err)
			}
		}
		if !fresh {
			return nil
		}
	}
}

// hand sends c's command line and stdio and waits for the standby to take
// them. sent reports that the message went (the standby may have run it).
func hand(conn *net.UnixConn, c standbyCall) (sent bool, err error) {
	var msg strings.Builder
	for _, a := range c.args {
		if strings.IndexByte(a, 0) >= 0 {
			return false, fmt.Errorf("argument %q holds a NUL byte", a)
		}
		msg.WriteString(a)
		msg.WriteByte(0)
	}
	if msg.Len() > standbyMax {
		return false, fmt.Errorf("command line of %d bytes, more than a standby takes (%d)", msg.Len(), standbyMax)
	}
	rights := unix.UnixRights(int(c.stdio[0].Fd()), int(c.stdio[1].Fd()), int(c.stdio[2].Fd()))
	conn.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if _, _, err := conn.WriteMsgUnix([]byte(msg.String()), rights, nil); err != nil {
		return false, fmt.Errorf("send: %w", err)
	}
	// Sent: from here it may run the command. It writes Go before it
	// returns to runsc's main; without Go it has not run it.
	return true, readByteWithin(conn, standbyGo, standbyReadyWithin)
}

// tookCommand reports whether a standby, dead now, wrote its Go byte
// before it died (after hand gave up waiting for it): the byte is then in
// the socket, and the read ends at once either way (the peer is gone).
func tookCommand(conn *net.UnixConn) bool {
	return readByteWithin(conn, standbyGo, time.Second) == nil
}

// readByteWithin reads one byte, which must be want, within d.
func readByteWithin(conn *net.UnixConn, want byte, d time.Duration) error {
	conn.SetReadDeadline(time.Now().Add(d))
	var b [1]byte
	n, err := conn.Read(b[:])
	if n == 0 && err == nil {
		err = io.EOF
	}
	if err != nil {
		return err
	}
	if b[0] != want {
		return fmt.Errorf("standby wrote %q, want %q", b[0], want)
	}
	return nil
}
