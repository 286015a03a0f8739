package agent

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/forkbox/forkbox/errdefs"
)

// Frame types.
const (
	frameHeader = 'H' // client → server: JSON request
	frameData   = 'D' // either way: a chunk of a stream
	frameEOF    = 'C' // client → server: the stream is closed
	frameKill   = 'K' // client → server: kill the running exec
	frameResult = 'R' // server → client: JSON result, last frame
	frameError  = 'E' // server → client: JSON wireError, last frame
	// PTY execs (see pty.go).
	frameResize  = 'Z' // client → server: JSON PtySize, the terminal's new size
	frameStarted = 'S' // server → client: JSON startResult, the process started
)

// Streams of data frames.
const (
	streamStdin  = 0 // also file content, both ways
	streamStdout = 1
	streamStderr = 2
)

const (
	frameHeaderLen = 6
	maxHeaderFrame = 1 << 20  // JSON frames
	maxDataFrame   = 1 << 20  // data frames
	chunkSize      = 32 << 10 // data frames the agent and client send
	// MaxFileSize is the largest file ReadFile and WriteFile move.
	MaxFileSize = 64 << 20
)

// Request operations.
const (
	opPing  = "ping"
	opExec  = "exec"
	opStart = "start"
	opRead  = "read"
	opWrite = "write"
	opList  = "list"
	opSync  = "sync"
	opFork  = "forked"
	// opUntar extracts the tar stream in the body into Path, at most Size
	// bytes; opTar sends Path as a tar stream in data frames, at most Size
	// bytes (see copy.go).
	opUntar = "untar"
	opTar   = "tar"
	// opRotate replaces the token (request.NewToken) and does nothing else.
	opRotate = "rotate"
	// opPty runs request.Exec on a new pseudo-terminal of size request.Pty.
	opPty = "pty"
	// File operations and exec signals (see fsops.go) and the polling
	// watch of a directory (see watch.go).
	opStat   = "stat"
	opMkdir  = "mkdir"
	opMove   = "move"
	opRemove = "remove"
	opWalk   = "walk"
	opSignal = "signal"
	opWatch  = "watch"
	// opAttach reattaches to a detached exec (request.Pid; see attach.go).
	opAttach = "attach"
)

// request is the JSON header frame that opens every connection.
type request struct {
	Token string       `json:"token"`
	Op    string       `json:"op"`
	Exec  *ExecRequest `json:"exec,omitempty"`
	Path  string       `json:"path,omitempty"`
	Mode  uint32       `json:"mode,omitempty"`
	Size  int64        `json:"size,omitempty"`
	Fork  *ForkNotice  `json:"fork,omitempty"`
	// NewToken is the token a rotate request installs.
	NewToken string `json:"new_token,omitempty"`
	// HasStdin says data frames for stdin follow, closed by an EOF frame.
	HasStdin bool `json:"has_stdin,omitempty"`
	// Stream asks a list for its entries as data frames (see handleList).
	Stream bool `json:"stream,omitempty"`
	// Pty is the terminal size of a pty exec.
	Pty *PtySize `json:"pty,omitempty"`
	// Notify asks an exec to send a started frame with its pid before any
	// output (Client.ExecStream).
	Notify bool `json:"notify,omitempty"`
	// Detach keeps an exec running when its connection fails, for an
	// attach to collect its output and result (Client.Attach).
	Detach bool `json:"detach,omitempty"`
	// Dest is a move's destination; Depth a walk's depth; Recursive says a
	// watch covers subdirectories.
	Dest      string `json:"dest,omitempty"`
	Depth     int    `json:"depth,omitempty"`
	Recursive bool   `json:"recursive,omitempty"`
	// Pid and Signal name a signal op's exec and signal number.
	Pid    int `json:"pid,omitempty"`
	Signal int `json:"signal,omitempty"`
}

// ExecRequest describes one command to run in the sandbox.
type ExecRequest struct {
	// Argv is the command; Argv[0] is looked up in the PATH of the merged env.
	Argv []string `json:"argv,omitempty"`
	// Shell, when Argv is empty, runs as ["/bin/sh", "-c", Shell].
	Shell string `json:"shell,omitempty"`
	// Env is merged over the agent's base environment.
	Env map[string]string `json:"env,omitempty"`
	// Cwd is the working directory; empty means "/".
	Cwd string `json:"cwd,omitempty"`
	// Stdin is written to the command's standard input, then closed.
	Stdin []byte `json:"-"`
	// Timeout, if positive, kills the process group when it expires.
	Timeout time.Duration `json:"timeout,omitempty"`
}

// ExecResult is how an exec ended.
type ExecResult struct {
	Pid int `json:"pid"`
	// ExitCode is the exit status, or 128+signo if a signal killed the process.
	ExitCode int `json:"exit_code"`
	// Signal is the name of the signal that killed the process ("SIGKILL").
	Signal    string        `json:"signal,omitempty"`
	Duration  time.Duration `json:"duration"`
	TimedOut  bool          `json:"timed_out,omitempty"`
	OOMKilled bool          `json:"oom_killed,omitempty"`
}

// Reasons of a ForkNotice.
const (
	ForkReasonFork = "fork" // the sandbox's memory was restored from another's checkpoint
	ForkReasonWake = "wake" // the sandbox was hibernated and woken
)

// ForkNotice tells an agent that it woke up in a restored copy of a
// sandbox's memory, and who it is now. The daemon sends it to every child
// right after a restore, and after a hibernate/wake cycle.
type ForkNotice struct {
	// Token is the agent's new token: once the agent has answered, only it is
	// accepted. Required for reason "fork"; for "wake", empty keeps the
	// current token.
	Token string `json:"token,omitempty"`
	// Hostname is the sandbox's hostname. An agent running as init sets it
	// with sethostname(2); it is given to the hook as HOSTNAME.
	Hostname string `json:"hostname,omitempty"`
	// MachineID is the sandbox's new machine id (the daemon writes
	// /etc/machine-id itself); given to the hook as FORKBOX_MACHINE_ID.
	MachineID string `json:"machine_id,omitempty"`
	// ParentID is the id of the sandbox whose memory this one holds; given to
	// the hook as FORKBOX_PARENT_ID.
	ParentID string `json:"parent_id,omitempty"`
	// Reason is ForkReasonFork or ForkReasonWake; given to the hook as
	// FORKBOX_FORK_REASON.
	Reason string `json:"reason"`
	// Time is the daemon's clock when it sent the notice.
	Time time.Time `json:"time"`
}

// ForkReply is the agent's answer to a ForkNotice.
type ForkReply struct {
	// HostnameSet says the notice's hostname was set (an agent of an
	// older build never says so).
	HostnameSet bool `json:"hostname_set,omitempty"`
	// HookRan says an on-fork hook was found and started.
	HookRan bool `json:"hook_ran"`
	// HookExitCode is the hook's exit status, 128+signo if a signal killed it
	// (137 when it was killed for running past its timeout).
	HookExitCode int `json:"hook_exit_code"`
	// HookOutput is the tail (at most MaxHookOutput bytes) of the hook's
	// stdout and stderr, interleaved.
	HookOutput string `json:"hook_output,omitempty"`
	// ClockSkew is the daemon's time minus the agent's when the notice
	// arrived: positive when the sandbox's clock is behind. Zero when the
	// notice carries no time.
	ClockSkew time.Duration `json:"clock_skew"`
}

// PingInfo is the agent's answer to Ping.
type PingInfo struct {
	Version  string `json:"version"`
	Hostname string `json:"hostname"`
}

// FileInfo is one entry of ListFiles.
type FileInfo struct {
	Name    string      `json:"name"`
	Size    int64       `json:"size"`
	Mode    os.FileMode `json:"mode"`
	IsDir   bool        `json:"is_dir"`
	ModTime time.Time   `json:"mtime"`
}

type startResult struct {
	Pid int `json:"pid"`
}

// listResult is a list's result frame. A streamed list sends its entries
// in data frames (JSON arrays of FileInfo) and only their count here.
type listResult struct {
	Entries []FileInfo `json:"entries"`
	Count   int        `json:"count,omitempty"`
}

// frameWriter writes frames to w; safe for concurrent use.
type frameWriter struct {
	mu  sync.Mutex
	w   io.Writer
	buf []byte
}

func (fw *frameWriter) write(typ, stream byte, payload []byte) error {
	fw.mu.Lock()
	defer fw.mu.Unlock()
	fw.buf = append(fw.buf[:0], typ, stream, 0, 0, 0, 0)
	binary.BigEndian.PutUint32(fw.buf[2:], uint32(len(payload)))
	fw.buf = append(fw.buf, payload...)
	_, err := fw.w.Write(fw.buf)
	return err
}

func (fw *frameWriter) writeJSON(typ byte, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode frame: %w", errdefs.ErrInternal)
	}
	return fw.write(typ, 0, b)
}

func (fw *frameWriter) writeError(err error) error {
	return fw.writeJSON(frameError, wireError{Class: errdefs.ClassName(err), Message: err.Error()})
}

// frame is one frame read from the wire.
type frame struct {
	typ     byte
	stream  byte
	payload []byte
}

// readFrame reads one frame. JSON frames may be up to maxHeaderFrame bytes,
// data frames up to maxDataFrame.
func readFrame(r io.Reader) (frame, error) {
	var h [frameHeaderLen]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return frame{}, err
	}
	n := binary.BigEndian.Uint32(h[2:])
	limit := uint32(maxDataFrame)
	if h[0] != frameData {
		limit = maxHeaderFrame
	}
	if n > limit {
		return frame{}, fmt.Errorf("frame of %d bytes: %w", n, errdefs.ErrResourceExhausted)
	}
	f := frame{typ: h[0], stream: h[1], payload: make([]byte, n)}
	if _, err := io.ReadFull(r, f.payload); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return frame{}, err
	}
	return f, nil
}
