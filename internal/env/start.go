package env

// Memory environments: a definition may end its setup with processes left
// running (Start, like E2B's template start command). Its warm snapshot is
// then a memory checkpoint of the builder, taken once the start command's
// readiness check passes: sandboxes handed over from it (and its warm pool)
// continue those processes, so a server started by Start answers at once.
// The builder is disposable (the capture stops it and nothing restores it),
// so no sandbox a user holds is ever stopped for it.

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/forkbox/forkbox/errdefs"
)

// StartCommand is what an environment leaves running in its snapshot.
type StartCommand struct {
	// Run is a shell command started in the background after the setup
	// steps; its processes are in every sandbox of the environment.
	Run string `json:"run"`
	// ReadyPort, when set, is a TCP port the snapshot waits for a
	// listening socket on (any address of the sandbox).
	ReadyPort int `json:"ready_port,omitempty"`
	// ReadyCommand, when set, is a shell command run until it exits 0.
	ReadyCommand string `json:"ready_command,omitempty"`
	// ReadyTimeout bounds the wait for readiness (default 60s).
	ReadyTimeout time.Duration `json:"ready_timeout,omitempty"`
}

const (
	maxStartBytes       = 64 << 10
	defaultReadyTimeout = time.Minute
	maxReadyTimeout     = 30 * time.Minute
	// readyPoll is how often readiness is checked again.
	readyPoll = 20 * time.Millisecond
	// readyCommandTimeout bounds one run of a ready command.
	readyCommandTimeout = 10 * time.Second
	// maxProcNetBytes bounds a read of /proc/net/tcp{,6} from a sandbox.
	maxProcNetBytes = 4 << 20
)

// checkStart validates a definition's start command.
func checkStart(s *StartCommand) error {
	if s == nil {
		return nil
	}
	if strings.TrimSpace(s.Run) == "" {
		return fmt.Errorf("start: a command (run) is required: %w", errdefs.ErrInvalidArgument)
	}
	if len(s.Run)+len(s.ReadyCommand) > maxStartBytes {
		return fmt.Errorf("start: the commands are %d bytes, more than %d: %w", len(s.Run)+len(s.ReadyCommand), maxStartBytes, errdefs.ErrResourceExhausted)
	}
	if s.ReadyPort < 0 || s.ReadyPort > 65535 {
		return fmt.Errorf("start: ready port %d: want 1 to 65535: %w", s.ReadyPort, errdefs.ErrInvalidArgument)
	}
	if s.ReadyTimeout < 0 || s.ReadyTimeout > maxReadyTimeout {
		return fmt.Errorf("start: ready timeout %s: want 0 (the default %s) to %s: %w", s.ReadyTimeout, defaultReadyTimeout, maxReadyTimeout, errdefs.ErrInvalidArgument)
	}
	return nil
}

// startAndCapture runs the start command in the builder, waits for its
// readiness check and takes the memory checkpoint that becomes the
// environment's snapshot. The builder is stopped by the capture.
func (m *Manager) startAndCapture(ctx context.Context, def Definition, builder string, progress func(Progress)) (string, error) {
	s := def.Start
	n := len(def.Steps)
	progress(Progress{Phase: "start", Steps: n, Message: s.Run})
	t := time.Now()
	if _, err := m.sb.Start(ctx, builder, s.Run); err != nil {
		return "", fmt.Errorf("start command (%s): %w", s.Run, err)
	}
	if s.ReadyPort != 0 || s.ReadyCommand != "" {
		progress(Progress{Phase: "ready", Steps: n, Message: readyLabel(s)})
		if err := m.waitReady(ctx, builder, s); err != nil {
			return "", err
		}
	}
	readyMS := msSince(t)
	progress(Progress{Phase: "checkpoint", Steps: n, Message: "memory checkpoint of the builder"})
	ck, err := m.sb.CheckpointMemory(ctx, builder, "env:"+def.Name+":start")
	if err != nil {
		return "", fmt.Errorf("memory checkpoint of the builder: %w", err)
	}
	m.event(ctx, def.Name, "env.started", map[string]any{"command": s.Run, "ready_ms": readyMS, "checkpoint": ck})
	return ck, nil
}

func readyLabel(s *StartCommand) string {
	var parts []string
	if s.ReadyPort != 0 {
		parts = append(parts, fmt.Sprintf("port %d listening", s.ReadyPort))
	}
	if s.ReadyCommand != "" {
		parts = append(parts, "`"+s.ReadyCommand+"` exits 0")
	}
	return "waiting for " + strings.Join(parts, " and ")
}

// waitReady polls the start command's readiness checks until both pass,
// within its timeout. A timeout is a FailedPrecondition (the definition's
// processes never got ready), with what was last seen.
func (m *Manager) waitReady(ctx context.Context, builder string, s *StartCommand) error {
	timeout := s.ReadyTimeout
	if timeout == 0 {
		timeout = defaultReadyTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(readyPoll)
	defer tick.Stop()
	portOK, cmdOK := s.ReadyPort == 0, s.ReadyCommand == ""
	last := ""
	for {
		if !portOK {
			b, err := m.readProcNet(ctx, builder)
			switch {
			case err != nil:
				last = "reading /proc/net/tcp: " + err.Error()
			case listening(b, s.ReadyPort):
				portOK = true
			default:
				last = fmt.Sprintf("nothing listens on port %d", s.ReadyPort)
			}
		}
		if portOK && !cmdOK {
			code, err := m.sb.Probe(ctx, builder, s.ReadyCommand, readyCommandTimeout)
			switch {
			case err != nil:
				last = fmt.Sprintf("ready command: %v", err)
			case code == 0:
				cmdOK = true
			default:
				last = fmt.Sprintf("ready command exited %d", code)
			}
		}
		if portOK && cmdOK {
			return nil
		}
		select {
		case <-ctx.Done():
			if ctx.Err() == context.DeadlineExceeded {
				return fmt.Errorf("start command not ready after %s (%s): %w", timeout, last, errdefs.ErrFailedPrecondition)
			}
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// readProcNet reads the builder's TCP socket tables (IPv4 and IPv6).
func (m *Manager) readProcNet(ctx context.Context, builder string) ([]byte, error) {
	var all []byte
	var firstErr error
	for _, p := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := m.sb.ReadFile(ctx, builder, p)
		if err != nil {
			if firstErr == nil {
				firstErr = err
			}
			continue
		}
		if len(b) > maxProcNetBytes {
			b = b[:maxProcNetBytes]
		}
		all = append(append(all, b...), '\n')
	}
	if all == nil {
		return nil, firstErr
	}
	return all, nil
}

// listening reports whether a /proc/net/tcp table (from the sandbox: parsed
// defensively) has a socket in LISTEN state on port.
func listening(table []byte, port int) bool {
	sc := bufio.NewScanner(bytes.NewReader(table))
	sc.Buffer(make([]byte, 4096), 4096)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		// sl local_address rem_address st ...
		if len(f) < 4 || f[3] != "0A" {
			continue
		}
		i := strings.LastIndexByte(f[1], ':')
		if i < 0 {
			continue
		}
		if p, err := strconv.ParseUint(f[1][i+1:], 16, 16); err == nil && int(p) == port {
			return true
		}
	}
	return false
}
