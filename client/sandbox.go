package client

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"time"

	"connectrpc.com/connect"

	v1 "github.com/forkbox/forkbox/api/forkbox/v1"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/errdefs/errconnect"
)

// Resources are a sandbox's limits: CPU cores ("1", "0.5"), memory ("512Mi").
type Resources struct {
	CPU    string `json:"cpu,omitempty"`
	Memory string `json:"memory,omitempty"`
	Pids   int64  `json:"pids,omitempty"`
	// Disk is the most its writable layer may hold ("2Gi"; "0" = no
	// limit; "" = the daemon's default). Past it, writes inside the
	// sandbox fail with EDQUOT. A fork counts only what it writes itself,
	// and inherits its parent's limit unless overridden.
	Disk string `json:"disk,omitempty"`
}

func (r Resources) proto() *v1.Resources {
	return &v1.Resources{Cpu: r.CPU, Memory: r.Memory, Pids: r.Pids, Disk: r.Disk}
}

// CreateOptions describe a new sandbox. Image is required.
type CreateOptions struct {
	Image     string
	Name      string
	Resources Resources
	Env       map[string]string
	Cwd       string
	// Egress is "none" (default), "all", or "allow" (implied by
	// EgressAllow): only EgressAllow, minus EgressDeny.
	Egress string
	// EgressAllow lists CIDRs ("10.1.0.0/16") and DNS names
	// ("api.example.com", "*.example.com") the sandbox may reach; names
	// resolve through the daemon's DNS proxy. EgressDeny wins over it.
	EgressAllow, EgressDeny []string
	Runtime                 string
	// Timeout closes the sandbox (or hibernates it, see OnTimeout) this
	// long after it starts; SetTimeout moves the deadline. 0: no timeout
	// (the daemon's --max-lifetime and --idle-timeout still apply). Forks
	// and restores inherit it.
	Timeout time.Duration
	// OnTimeout is what expiry does: "close" (default) or "hibernate"
	// (gvisor only; the next exec wakes it).
	OnTimeout string
}

// Info is what the daemon knows of a sandbox.
type Info = v1.Sandbox

// Sandbox is a handle on one sandbox.
type Sandbox struct {
	c    *Client
	ID   string
	Info *Info
	// slot: this handle holds one of its client's concurrency slots.
	slot bool
}

// CreateSandbox creates a sandbox and returns once it is ready for exec.
func (c *Client) CreateSandbox(ctx context.Context, o CreateOptions) (*Sandbox, error) {
	c.init()
	if err := c.acquire(1); err != nil {
		return nil, err
	}
	resp, err := c.sbx.CreateSandbox(ctx, connect.NewRequest(&v1.CreateSandboxRequest{
		Image: o.Image, Name: o.Name, Env: o.Env, Cwd: o.Cwd, Egress: o.Egress, Runtime: o.Runtime,
		Resources: o.Resources.proto(), TimeoutMs: durationMs(o.Timeout), OnTimeout: o.OnTimeout,
		EgressAllow: o.EgressAllow, EgressDeny: o.EgressDeny,
	}))
	if err != nil {
		c.release(1)
		return nil, errconnect.FromConnect(err)
	}
	return &Sandbox{c: c, ID: resp.Msg.Sandbox.Id, Info: resp.Msg.Sandbox, slot: true}, nil
}

// Sandbox returns a handle on an existing sandbox, by ID or name.
func (c *Client) Sandbox(ctx context.Context, idOrName string) (*Sandbox, error) {
	c.init()
	resp, err := c.sbx.GetSandbox(ctx, connect.NewRequest(&v1.GetSandboxRequest{Sandbox: idOrName}))
	if err != nil {
		return nil, errconnect.FromConnect(err)
	}
	return &Sandbox{c: c, ID: resp.Msg.Sandbox.Id, Info: resp.Msg.Sandbox}, nil
}

// ListSandboxes lists live sandboxes, or all (closed too), following every
// page (ListSandboxesPage and AllSandboxes take one page at a time).
func (c *Client) ListSandboxes(ctx context.Context, all bool) ([]*Info, error) {
	return c.ListAll(ctx, ListOptions{All: all, PageSize: fullPage})
}

// Refresh reloads the sandbox's info.
func (s *Sandbox) Refresh(ctx context.Context) error {
	n, err := s.c.Sandbox(ctx, s.ID)
	if err != nil {
		return err
	}
	s.Info = n.Info
	return nil
}

// Close closes the sandbox: nothing of it is left on the host.
func (s *Sandbox) Close(ctx context.Context) error {
	_, err := s.c.sbx.DeleteSandbox(ctx, connect.NewRequest(&v1.DeleteSandboxRequest{Sandbox: s.ID}))
	if err == nil || errdefs.IsNotFound(errconnect.FromConnect(err)) {
		s.c.slotMu.Lock()
		held := s.slot
		s.slot = false
		s.c.slotMu.Unlock()
		if held {
			s.c.release(1)
		}
	}
	return errconnect.FromConnect(err)
}

// ExecOptions is one command. Give Argv, or Shell (run by /bin/sh -c).
type ExecOptions struct {
	Argv    []string
	Shell   string
	Env     map[string]string
	Cwd     string
	Stdin   []byte
	Timeout time.Duration
	// NonReplayable execs are skipped when the session is resumed.
	NonReplayable bool
	// AutoResume unpauses a paused sandbox and runs the command, instead
	// of failing with FailedPrecondition. (A hibernated sandbox is always
	// woken by an exec.)
	AutoResume bool
	// Stdout and Stderr receive the output as it is produced (nil: dropped).
	// A write that fails or is short fails Exec with its error (Internal)
	// and stops the command in the sandbox.
	Stdout, Stderr io.Writer
}

// ExecResult is how a command ended.
type ExecResult struct {
	ExitCode  int
	Signal    string
	Duration  time.Duration
	TimedOut  bool
	OOMKilled bool
}

// Exec runs a command and waits for it, streaming its output.
func (s *Sandbox) Exec(ctx context.Context, o ExecOptions) (*ExecResult, error) {
	res, err := s.exec(ctx, o)
	if err != nil && o.AutoResume && errdefs.IsFailedPrecondition(err) {
		if info, ierr := s.c.Sandbox(ctx, s.ID); ierr == nil && info.Info.State == "paused" {
			if uerr := s.Unpause(ctx); uerr != nil {
				return nil, uerr
			}
			return s.exec(ctx, o)
		}
	}
	return res, err
}

func (s *Sandbox) exec(ctx context.Context, o ExecOptions) (*ExecResult, error) {
	stream, err := s.c.sbx.Exec(ctx, connect.NewRequest(&v1.ExecRequest{
		Sandbox: s.ID, Argv: o.Argv, Shell: o.Shell, Env: o.Env, Cwd: o.Cwd, Stdin: o.Stdin,
		TimeoutMs: o.Timeout.Milliseconds(), NonReplayable: o.NonReplayable,
	}))
	if err != nil {
		return nil, errconnect.FromConnect(err)
	}
	defer stream.Close()
	var res *ExecResult
	for stream.Receive() {
		switch ev := stream.Msg().Event.(type) {
		case *v1.ExecResponse_Stdout:
			if err := writeOutput(o.Stdout, ev.Stdout); err != nil {
				return nil, fmt.Errorf("exec in %s: write its stdout: %w (the exec was stopped): %w", s.ID, err, errdefs.ErrInternal)
			}
		case *v1.ExecResponse_Stderr:
			if err := writeOutput(o.Stderr, ev.Stderr); err != nil {
				return nil, fmt.Errorf("exec in %s: write its stderr: %w (the exec was stopped): %w", s.ID, err, errdefs.ErrInternal)
			}
		case *v1.ExecResponse_Exit:
			x := ev.Exit
			res = &ExecResult{ExitCode: int(x.ExitCode), Signal: x.Signal, TimedOut: x.TimedOut, OOMKilled: x.OomKilled,
				Duration: time.Duration(x.DurationMs * float64(time.Millisecond))}
		}
	}
	if err := stream.Err(); err != nil {
		return nil, errconnect.FromConnect(err)
	}
	if res == nil {
		return nil, errconnect.FromConnect(connect.NewError(connect.CodeUnavailable, io.ErrUnexpectedEOF))
	}
	return res, nil
}

// writeOutput writes p to w (nil: nowhere). A failed or short write is an
// error: the caller's output would be incomplete, so exec returns it, and
// closing the call stops the exec in the sandbox.
func writeOutput(w io.Writer, p []byte) error {
	if w == nil {
		return nil
	}
	n, err := w.Write(p)
	if err == nil && n < len(p) {
		err = io.ErrShortWrite
	}
	return err
}

// Start runs a command in the background and returns its pid.
func (s *Sandbox) Start(ctx context.Context, o ExecOptions) (int, error) {
	stream, err := s.c.sbx.Exec(ctx, connect.NewRequest(&v1.ExecRequest{
		Sandbox: s.ID, Argv: o.Argv, Shell: o.Shell, Env: o.Env, Cwd: o.Cwd, Stdin: o.Stdin, Background: true,
	}))
	if err != nil {
		return 0, errconnect.FromConnect(err)
	}
	defer stream.Close()
	pid := 0
	for stream.Receive() {
		if st, ok := stream.Msg().Event.(*v1.ExecResponse_Started); ok {
			pid = int(st.Started.Pid)
		}
	}
	return pid, errconnect.FromConnect(stream.Err())
}

// ReadFile reads a file in the sandbox.
func (s *Sandbox) ReadFile(ctx context.Context, path string) ([]byte, error) {
	resp, err := s.c.sbx.ReadFile(ctx, connect.NewRequest(&v1.ReadFileRequest{Sandbox: s.ID, Path: path}))
	if err != nil {
		return nil, errconnect.FromConnect(err)
	}
	return resp.Msg.Data, nil
}

// WriteFile writes a file in the sandbox (mode 0 = 0644).
func (s *Sandbox) WriteFile(ctx context.Context, path string, data []byte, mode uint32) error {
	_, err := s.c.sbx.WriteFile(ctx, connect.NewRequest(&v1.WriteFileRequest{Sandbox: s.ID, Path: path, Data: data, Mode: mode}))
	return errconnect.FromConnect(err)
}

// FileInfo describes one directory entry.
type FileInfo = v1.FileInfo

// ListFiles lists a directory in the sandbox.
func (s *Sandbox) ListFiles(ctx context.Context, path string) ([]*FileInfo, error) {
	resp, err := s.c.sbx.ListFiles(ctx, connect.NewRequest(&v1.ListFilesRequest{Sandbox: s.ID, Path: path}))
	if err != nil {
		return nil, errconnect.FromConnect(err)
	}
	return resp.Msg.Files, nil
}

// Event is one ledger entry.
type Event struct {
	Seq  int64          `json:"seq"`
	Type string         `json:"type"`
	Time time.Time      `json:"time"`
	Data map[string]any `json:"data"`
}

// Events returns the sandbox's ledger, oldest first.
func (s *Sandbox) Events(ctx context.Context) ([]Event, error) {
	return s.c.Events(ctx, s.ID)
}

// Events returns a sandbox's ledger (closed sandboxes too), oldest first.
func (c *Client) Events(ctx context.Context, idOrName string) ([]Event, error) {
	c.init()
	var out []Event
	req := &v1.EventsRequest{Sandbox: idOrName, PageSize: fullPage}
	for {
		resp, err := c.sbx.Events(ctx, connect.NewRequest(req))
		if err != nil {
			return nil, errconnect.FromConnect(err)
		}
		for _, e := range resp.Msg.Events {
			ev := Event{Seq: e.Seq, Type: e.Type, Time: time.UnixMilli(e.TimeUnixMs)}
			_ = json.Unmarshal([]byte(e.DataJson), &ev.Data)
			out = append(out, ev)
		}
		if resp.Msg.NextPageToken == "" {
			return out, nil
		}
		req.PageToken = resp.Msg.NextPageToken
	}
}
