package agent

import (
	"crypto/subtle"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/errdefs"
)

// DefaultForkHooks are the places the on-fork hook is looked for, in order.
var DefaultForkHooks = []string{"/etc/forkbox/on-fork", "/.forkbox/on-fork"}

const (
	// DefaultForkHookTimeout bounds an on-fork hook's run.
	DefaultForkHookTimeout = 30 * time.Second
	// MaxHookOutput is how much of the hook's output ForkReply carries.
	MaxHookOutput = 4 << 10
)

// Environment of the on-fork hook, besides HOSTNAME.
const (
	EnvForkReason = "FORKBOX_FORK_REASON"
	EnvParentID   = "FORKBOX_PARENT_ID"
	EnvMachineID  = "FORKBOX_MACHINE_ID"
)

// handleForked swaps the token, sets the hostname (as init), runs the
// on-fork hook and answers with a ForkReply. The token is swapped before the
// hook runs, so that by the time the client reads the reply only the new
// token is accepted; connections already authenticated carry on.
func (s *Server) handleForked(fw *frameWriter, req *request, received time.Time) error {
	n := req.Fork
	if n == nil {
		return fmt.Errorf("forked: missing notice: %w", errdefs.ErrInvalidArgument)
	}
	switch n.Reason {
	case ForkReasonFork:
		if n.Token == "" {
			return fmt.Errorf("forked: a fork needs a new token: %w", errdefs.ErrInvalidArgument)
		}
	case ForkReasonWake:
	default:
		return fmt.Errorf("forked: reason %q, want %q or %q: %w", n.Reason, ForkReasonFork, ForkReasonWake, errdefs.ErrInvalidArgument)
	}
	var reply ForkReply
	if !n.Time.IsZero() {
		reply.ClockSkew = n.Time.Sub(received)
	}

	s.forkMu.Lock()
	defer s.forkMu.Unlock()
	// Another notice may have swapped the token since this one was checked.
	if subtle.ConstantTimeCompare([]byte(req.Token), []byte(*s.token.Load())) != 1 {
		return fmt.Errorf("forked: token already replaced: %w", errdefs.ErrUnauthenticated)
	}
	if n.Token != "" {
		tok := n.Token
		s.token.Store(&tok)
		s.pending.Store(nil)
	}
	log := s.log.With("reason", n.Reason, "parent", n.ParentID, "machine_id", n.MachineID)
	if n.Hostname != "" && s.cfg.Init {
		// Only as init: the agent then owns the sandbox's UTS namespace; a
		// test agent would rename the host. A tenant of a pre-booted
		// sandbox may not (EPERM): its placeholder does it (holdname.go).
		err := unix.Sethostname([]byte(n.Hostname))
		if errors.Is(err, unix.EPERM) {
			err = setHostnameViaHold(n.Hostname)
		}
		if err != nil {
			log.Warn("forked: sethostname", "hostname", n.Hostname, "err", err)
		}
		reply.HostnameSet = err == nil
	}
	hook := s.findHook()
	if hook != "" {
		reply.HookRan = true
		var err error
		reply.HookExitCode, reply.HookOutput, err = s.runHook(hook, n)
		if err != nil {
			// The hook could not start: report it like a failed hook.
			reply.HookExitCode = 127
			reply.HookOutput = err.Error()
		}
	}
	log.Info("agent forked", "hostname", n.Hostname, "token_swapped", n.Token != "",
		"hook", hook, "hook_exit_code", reply.HookExitCode, "clock_skew", reply.ClockSkew)
	return fw.writeJSON(frameResult, reply)
}

// handleRotate installs req.NewToken as the pending token: both tokens are
// accepted until the first request made with the new one, from then on only
// the new one (see tokenOK). A daemon that crashes between the rotation and
// recording the new token can still reach the agent with the old one.
func (s *Server) handleRotate(fw *frameWriter, req *request) error {
	if req.NewToken == "" {
		return fmt.Errorf("rotate: empty token: %w", errdefs.ErrInvalidArgument)
	}
	s.forkMu.Lock()
	defer s.forkMu.Unlock()
	if subtle.ConstantTimeCompare([]byte(req.Token), []byte(*s.token.Load())) != 1 {
		return fmt.Errorf("rotate: token already replaced: %w", errdefs.ErrUnauthenticated)
	}
	tok := req.NewToken
	s.pending.Store(&tok)
	s.log.Info("agent token rotation started")
	return fw.writeJSON(frameResult, struct{}{})
}

// findHook returns the first executable regular file of the hook paths, or
// "".
func (s *Server) findHook() string {
	for _, p := range s.cfg.ForkHooks {
		fi, err := os.Stat(p)
		if err != nil {
			if !errors.Is(err, os.ErrNotExist) {
				s.log.Warn("forked: hook", "path", p, "err", err)
			}
			continue
		}
		if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
			s.log.Warn("forked: hook is not an executable file, skipped", "path", p, "mode", fi.Mode().String())
			continue
		}
		return p
	}
	return ""
}

// runHook runs the hook at path with the notice in its environment, its
// stdout and stderr captured together, and returns its exit code and the tail
// of its output. It is killed with its process group after the hook timeout.
func (s *Server) runHook(path string, n *ForkNotice) (int, string, error) {
	host := n.Hostname
	if host == "" {
		host, _ = os.Hostname()
	}
	req := &ExecRequest{Argv: []string{path}, Env: map[string]string{
		EnvForkReason: n.Reason,
		EnvParentID:   n.ParentID,
		EnvMachineID:  n.MachineID,
		"HOSTNAME":    host,
	}}
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return 0, "", osErr("open", os.DevNull, err)
	}
	defer devnull.Close()
	outR, outW, err := os.Pipe()
	if err != nil {
		return 0, "", osErr("pipe", "hook output", err)
	}
	defer outR.Close()
	s.watch.begin()
	defer s.watch.end()
	st, done, err := s.startProcess(req, [3]*os.File{devnull, outW, outW}, false)
	outW.Close()
	if err != nil {
		return 0, "", err
	}
	defer s.removeExec(st)
	timeout := s.cfg.ForkHookTimeout
	timer := time.AfterFunc(timeout, func() {
		st.timedOut.Store(true)
		st.killGroup()
	})
	defer timer.Stop()

	tail := &tailWriter{max: MaxHookOutput}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		// Ends at EOF or the read deadline, after what outR holds then.
		_ = readUntil(outR, make([]byte, chunkSize), func(p []byte) { tail.Write(p) })
	}()
	ws := <-done
	s.markSentryOOM(st, ws)
	st.markExited()
	outR.SetReadDeadline(time.Now().Add(drainGrace))
	wg.Wait()
	if st.timedOut.Load() {
		fmt.Fprintf(tail, "\n[forkbox: on-fork hook killed after %v]\n", timeout)
	}
	if st.oomKilled.Load() {
		fmt.Fprintf(tail, "\n[forkbox: on-fork hook killed: out of memory]\n")
	}
	code, _ := exitStatus(ws)
	return code, tail.String(), nil
}

// tailWriter keeps the last max bytes written to it.
type tailWriter struct {
	max int
	buf []byte
}

func (t *tailWriter) Write(p []byte) (int, error) {
	t.buf = append(t.buf, p...)
	if len(t.buf) > 2*t.max {
		t.buf = append(t.buf[:0], t.buf[len(t.buf)-t.max:]...)
	}
	return len(p), nil
}

// String returns the tail, cut to max bytes and to a rune boundary.
func (t *tailWriter) String() string {
	b := t.buf
	if len(b) > t.max {
		b = b[len(b)-t.max:]
		for i := 0; i < utf8.UTFMax && len(b) > 0 && !utf8.RuneStart(b[0]); i++ {
			b = b[1:]
		}
	}
	return string(b)
}
