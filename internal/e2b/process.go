package e2b

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"path"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"

	"github.com/forkbox/forkbox/api/e2b/process"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/agent"
	"github.com/forkbox/forkbox/internal/daemon"
	"github.com/forkbox/forkbox/internal/store"
)

// processService is envd's process.Process on forkbox execs.
type processService struct{ s *Server }

// checkUser refuses an envd user other than root: forkbox runs a
// sandbox's commands and file operations as root.
func checkUser(h http.Header) error {
	a := h.Get("Authorization")
	if a == "" {
		return nil
	}
	b, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(a, "Basic "))
	user, _, _ := strings.Cut(string(b), ":")
	if err != nil || !strings.HasPrefix(a, "Basic ") {
		return fmt.Errorf("authorization header is not E2B's Basic user header: %w", errdefs.ErrInvalidArgument)
	}
	if user != "" && user != "root" {
		return fmt.Errorf("user %.32q: forkbox runs commands and file operations as root (pass user: 'root' or none): %w", user, errdefs.ErrInvalidArgument)
	}
	return nil
}

// keepAlive is how often a long stream sends a keepalive: the client's
// Keepalive-Ping-Interval (seconds), 50 s by default, 1 s to 300 s.
func keepAlive(h http.Header) time.Duration {
	n, err := strconv.Atoi(h.Get("Keepalive-Ping-Interval"))
	if err != nil || n <= 0 {
		n = 50
	}
	return time.Duration(min(max(n, 1), 300)) * time.Second
}

// requestTimeout is the Connect timeout the client set on a Start: the
// process's own timeout, as envd makes it (0: none).
func requestTimeout(h http.Header) time.Duration {
	n, err := strconv.ParseInt(h.Get("Connect-Timeout-Ms"), 10, 64)
	if err != nil || n <= 0 {
		return 0
	}
	return time.Duration(n) * time.Millisecond
}

// resolve makes an E2B path absolute: a relative one is taken from the
// sandbox's working directory ("/" by default). ".." stays in, for the
// agent to refuse.
func resolve(sb *store.Sandbox, p string) string {
	if p == "" || strings.HasPrefix(p, "/") {
		return p
	}
	base := sb.Config.Cwd
	if base == "" {
		base = "/"
	}
	return strings.TrimSuffix(base, "/") + "/" + p
}

// hasBash reports whether /bin/bash exists in the sandbox. E2B's SDKs run
// every command as /bin/bash -l -c; in an image without bash, /bin/sh
// runs it instead (see README).
func (s *Server) hasBash(ctx context.Context, id string) bool {
	if v, ok := s.bash.Load(id); ok {
		return v.(bool)
	}
	_, err := s.d.Stat(ctx, id, "/bin/bash")
	if err != nil && !errdefs.IsNotFound(err) {
		return true // unknown: let the exec say
	}
	s.bash.Store(id, err == nil)
	return err == nil
}

func (s *Server) startProc(ctx context.Context, sb *store.Sandbox, m *process.StartRequest, timeout time.Duration) (*proc, *sub, error) {
	cfg := m.GetProcess()
	if cfg.GetCmd() == "" {
		return nil, nil, fmt.Errorf("process.cmd is required: %w", errdefs.ErrInvalidArgument)
	}
	release, err := s.procs.reserve(sb.ID)
	if err != nil {
		return nil, nil, err
	}
	defer release()
	argv := append([]string{cfg.Cmd}, cfg.Args...)
	if cfg.Cmd == "/bin/bash" && !s.hasBash(ctx, sb.ID) {
		argv[0] = "/bin/sh"
	}
	cwd := ""
	if cfg.Cwd != nil {
		cwd = path.Clean(resolve(sb, cfg.GetCwd()))
	}
	req := agent.ExecRequest{Argv: argv, Env: cfg.Envs, Cwd: cwd, Timeout: timeout}
	p := &proc{sandbox: sb.ID, tag: m.GetTag(), config: cfg, subs: map[*sub]struct{}{}}
	first := newSub()
	p.subs[first] = struct{}{}
	// The process outlives this request (E2B lists it, reconnects to it,
	// follows it across hibernations), so it runs under the server's
	// context; until it has started, the request's end ends it too: an
	// agent that never reports the start holds neither the request nor
	// the sandbox's process slot.
	pctx, cancel := context.WithCancel(s.ctx)
	stopEarly := context.AfterFunc(ctx, cancel)
	if m.Pty != nil {
		size := agent.PtySize{Rows: int(m.Pty.GetSize().GetRows()), Cols: int(m.Pty.GetSize().GetCols())}
		sess, err := s.d.Pty(pctx, sb.ID, daemon.PtyOptions{ExecRequest: req, Size: size})
		if !stopEarly() && err == nil { // the request ended as it started
			sess.Close()
			err = startAbandoned(ctx)
		}
		if err != nil {
			cancel()
			return nil, nil, err
		}
		p.pty, p.pid = sess, uint32(sess.Pid())
		s.procs.add(p)
		s.goOwned(func() {
			defer cancel()
			res, err := sess.Wait(s.ctx, func(b []byte) error {
				output{p: p, pty: true}.Write(b)
				return nil
			})
			s.finish(p, res, err)
		})
		return p, first, nil
	}
	var stdin io.ReadCloser
	if m.GetStdin() {
		var pr *io.PipeReader
		pr, p.stdin = io.Pipe()
		stdin = pr
	}
	started := make(chan error, 1)
	var didStart atomic.Bool
	epoch, _ := s.pauses.state(sb.ID)
	s.goOwned(func() {
		defer cancel()
		res, err := s.d.ExecStream(pctx, sb.ID, daemon.ExecOptions{ExecRequest: req}, agent.ExecIO{
			Stdin: stdin, Stdout: output{p: p}, Stderr: output{p: p, stderr: true}, Detach: true,
			Started: func(pid int) {
				p.pid = uint32(pid)
				s.procs.add(p)
				didStart.Store(true)
				started <- nil
			}})
		if !didStart.Load() { // it never started: Start reports the error
			if err == nil {
				err = fmt.Errorf("exec ended without starting: %w", errdefs.ErrInternal)
			}
			started <- err
			return
		}
		res, err = s.reattach(sb.ID, p, epoch, res, err)
		s.finish(p, res, err)
	})
	err = <-started // sent on every path, the cancel's included
	if !stopEarly() && err == nil {
		// The request ended as the process started: the cancel kills it,
		// and its end is published as any other's, to no stream of this
		// request's (whose output would wait on a reader that is gone).
		first.leave(p)
		err = startAbandoned(ctx)
	}
	if err != nil {
		if p.stdin != nil {
			p.stdin.Close()
		}
		return nil, nil, err
	}
	return p, first, nil
}

// startAbandoned is the error of a start whose request ended before the
// process started.
func startAbandoned(ctx context.Context) error {
	return fmt.Errorf("the request ended before the process started (%v): %w", context.Cause(ctx), errdefs.ErrCanceled)
}

// reattach follows a process across the hibernations of its sandbox: its
// stream ends with its connection when the endpoint hibernates the
// sandbox (epoch counts those), and once the sandbox is awake again it
// reattaches to the process, which ran on in the sandbox's memory (its
// stdin is closed by then). It returns how the process ended, or the
// first error that was not a hibernation's.
func (s *Server) reattach(id string, p *proc, epoch int, res daemon.ExecResult, err error) (daemon.ExecResult, error) {
	for err != nil {
		now, woke := s.pauses.state(id)
		if now == epoch {
			return res, err // no hibernation since: a real failure
		}
		if woke != nil {
			select {
			case <-woke:
			case <-s.ctx.Done():
				return res, err
			}
		}
		epoch = now
		s.log.Debug("reattaching to a process after a hibernation", "sandbox", id, "exec", p.pid)
		res, err = s.d.Attach(s.ctx, id, int(p.pid), agent.ExecIO{Stdout: output{p: p}, Stderr: output{p: p, stderr: true}})
	}
	return res, err
}

// finish publishes a process's end and forgets it.
func (s *Server) finish(p *proc, res daemon.ExecResult, err error) {
	s.procs.remove(p)
	if p.stdin != nil {
		p.stdin.Close()
	}
	end := &process.ProcessEvent_EndEvent{}
	switch {
	case err != nil:
		msg := err.Error()
		end.ExitCode, end.Status, end.Error = -1, "error", &msg
	case res.Signal != "":
		// As envd (Go's os.ProcessState) reports it: exit code -1.
		end.ExitCode, end.Status = -1, "signal: "+signalWord(res.Signal)
		end.Error = &end.Status
	default:
		end.ExitCode, end.Exited, end.Status = int32(res.ExitCode), true, "exit status "+strconv.Itoa(res.ExitCode)
		if res.ExitCode != 0 {
			end.Error = &end.Status
		}
	}
	p.publish(&process.ProcessEvent{Event: &process.ProcessEvent_End{End: end}}, true)
}

func signalWord(sig string) string {
	switch sig {
	case "SIGKILL":
		return "killed"
	case "SIGTERM":
		return "terminated"
	case "SIGINT":
		return "interrupt"
	case "SIGHUP":
		return "hangup"
	}
	return strings.ToLower(strings.TrimPrefix(sig, "SIG"))
}

// forward sends a process's events from sub until it ends, the client
// goes away or the stream lags past subStall; keepalives in between.
func forward(ctx context.Context, h http.Header, p *proc, sb *sub, send func(*process.ProcessEvent) error) error {
	defer sb.leave(p)
	t := time.NewTicker(keepAlive(h))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-sb.cut:
			return fmt.Errorf("the stream of process %d took none of its output for %s and was cut (the process runs on; connect again): %w", p.pid, subStall, errdefs.ErrResourceExhausted)
		case ev, ok := <-sb.ch:
			if !ok {
				return nil
			}
			if err := send(ev); err != nil {
				return err
			}
		case <-t.C:
			if err := send(&process.ProcessEvent{Event: &process.ProcessEvent_Keepalive{Keepalive: &process.ProcessEvent_KeepAlive{}}}); err != nil {
				return err
			}
		}
	}
}

func startEvent(pid uint32) *process.ProcessEvent {
	return &process.ProcessEvent{Event: &process.ProcessEvent_Start{Start: &process.ProcessEvent_StartEvent{Pid: pid}}}
}

func (ps *processService) Start(ctx context.Context, req *connect.Request[process.StartRequest], stream *connect.ServerStream[process.StartResponse]) error {
	sb := sandboxOf(ctx)
	if err := checkUser(req.Header()); err != nil {
		return err
	}
	p, first, err := ps.s.startProc(ctx, sb, req.Msg, requestTimeout(req.Header()))
	if err != nil {
		return err
	}
	send := func(ev *process.ProcessEvent) error { return stream.Send(&process.StartResponse{Event: ev}) }
	if err := send(startEvent(p.pid)); err != nil {
		first.leave(p)
		return err
	}
	return forward(ctx, req.Header(), p, first, send)
}

func (ps *processService) Connect(ctx context.Context, req *connect.Request[process.ConnectRequest], stream *connect.ServerStream[process.ConnectResponse]) error {
	sb := sandboxOf(ctx)
	p, err := ps.s.procs.find(sb.ID, req.Msg.GetProcess())
	if err != nil {
		return err
	}
	sub := newSub()
	if !p.attach(sub) {
		return fmt.Errorf("process %d has ended: %w", p.pid, errdefs.ErrNotFound)
	}
	send := func(ev *process.ProcessEvent) error { return stream.Send(&process.ConnectResponse{Event: ev}) }
	if err := send(startEvent(p.pid)); err != nil {
		sub.leave(p)
		return err
	}
	return forward(ctx, req.Header(), p, sub, send)
}

func (ps *processService) List(ctx context.Context, req *connect.Request[process.ListRequest]) (*connect.Response[process.ListResponse], error) {
	sb := sandboxOf(ctx)
	out := &process.ListResponse{}
	for _, p := range ps.s.procs.list(sb.ID) {
		pi := &process.ProcessInfo{Config: p.config, Pid: p.pid}
		if p.tag != "" {
			pi.Tag = &p.tag
		}
		out.Processes = append(out.Processes, pi)
	}
	return connect.NewResponse(out), nil
}

// input writes to a process's stdin or terminal.
func input(p *proc, in *process.ProcessInput) error {
	switch v := in.GetInput().(type) {
	case *process.ProcessInput_Stdin:
		if p.stdin == nil {
			return fmt.Errorf("process %d was started without stdin (pass stdin: true): %w", p.pid, errdefs.ErrFailedPrecondition)
		}
		if _, err := p.stdin.Write(v.Stdin); err != nil {
			return fmt.Errorf("process %d: stdin is closed: %w", p.pid, errdefs.ErrFailedPrecondition)
		}
		return nil
	case *process.ProcessInput_Pty:
		if p.pty == nil {
			return fmt.Errorf("process %d has no terminal: %w", p.pid, errdefs.ErrFailedPrecondition)
		}
		return p.pty.Input(v.Pty)
	}
	return fmt.Errorf("input: stdin or pty is required: %w", errdefs.ErrInvalidArgument)
}

func (ps *processService) SendInput(ctx context.Context, req *connect.Request[process.SendInputRequest]) (*connect.Response[process.SendInputResponse], error) {
	p, err := ps.s.procs.find(sandboxOf(ctx).ID, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if err := input(p, req.Msg.GetInput()); err != nil {
		return nil, err
	}
	return connect.NewResponse(&process.SendInputResponse{}), nil
}

func (ps *processService) StreamInput(ctx context.Context, stream *connect.ClientStream[process.StreamInputRequest]) (*connect.Response[process.StreamInputResponse], error) {
	var p *proc
	for stream.Receive() {
		switch ev := stream.Msg().GetEvent().(type) {
		case *process.StreamInputRequest_Start:
			found, err := ps.s.procs.find(sandboxOf(ctx).ID, ev.Start.GetProcess())
			if err != nil {
				return nil, err
			}
			p = found
		case *process.StreamInputRequest_Data:
			if p == nil {
				return nil, fmt.Errorf("stream input: a start event must come first: %w", errdefs.ErrInvalidArgument)
			}
			if err := input(p, ev.Data.GetInput()); err != nil {
				return nil, err
			}
		}
	}
	if err := stream.Err(); err != nil {
		return nil, err
	}
	return connect.NewResponse(&process.StreamInputResponse{}), nil
}

func (ps *processService) SendSignal(ctx context.Context, req *connect.Request[process.SendSignalRequest]) (*connect.Response[process.SendSignalResponse], error) {
	sb := sandboxOf(ctx)
	p, err := ps.s.procs.find(sb.ID, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	sig := int(req.Msg.GetSignal())
	if sig != 9 && sig != 15 {
		return nil, fmt.Errorf("signal %d: want SIGTERM (15) or SIGKILL (9): %w", sig, errdefs.ErrInvalidArgument)
	}
	if err := ps.s.d.Signal(ctx, sb.ID, int(p.pid), sig); err != nil {
		return nil, err
	}
	return connect.NewResponse(&process.SendSignalResponse{}), nil
}

func (ps *processService) CloseStdin(ctx context.Context, req *connect.Request[process.CloseStdinRequest]) (*connect.Response[process.CloseStdinResponse], error) {
	p, err := ps.s.procs.find(sandboxOf(ctx).ID, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	switch {
	case p.stdin != nil:
		p.stdin.Close()
	case p.pty != nil:
		if err := p.pty.CloseInput(); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("process %d was started without stdin: %w", p.pid, errdefs.ErrFailedPrecondition)
	}
	return connect.NewResponse(&process.CloseStdinResponse{}), nil
}

func (ps *processService) Update(ctx context.Context, req *connect.Request[process.UpdateRequest]) (*connect.Response[process.UpdateResponse], error) {
	p, err := ps.s.procs.find(sandboxOf(ctx).ID, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if req.Msg.Pty == nil {
		return connect.NewResponse(&process.UpdateResponse{}), nil
	}
	if p.pty == nil {
		return nil, fmt.Errorf("process %d has no terminal to resize: %w", p.pid, errdefs.ErrFailedPrecondition)
	}
	size := req.Msg.Pty.GetSize()
	if err := p.pty.Resize(agent.PtySize{Rows: int(size.GetRows()), Cols: int(size.GetCols())}); err != nil {
		return nil, err
	}
	return connect.NewResponse(&process.UpdateResponse{}), nil
}
