package server

import (
	"context"
	"encoding/json"
	"sync"
	"time"

	"connectrpc.com/connect"

	v1 "github.com/forkbox/forkbox/api/forkbox/v1"
	"github.com/forkbox/forkbox/internal/agent"
	"github.com/forkbox/forkbox/internal/daemon"
	"github.com/forkbox/forkbox/internal/store"
)

type sandboxes struct{ d *daemon.Daemon }

func toSandbox(d *daemon.Daemon, sb *store.Sandbox) *v1.Sandbox {
	cpu := sb.Config.CPUString
	mem := sb.Config.MemoryStr
	return &v1.Sandbox{
		Id: sb.ID, Name: sb.Name, State: string(sb.State), Image: sb.Image, ImageDigest: sb.ImageDigest,
		Resources:       &v1.Resources{Cpu: cpu, Memory: mem, Pids: sb.Config.Pids, Disk: sb.Config.DiskStr},
		Env:             sb.Config.Env,
		Cwd:             sb.Config.Cwd,
		Egress:          sb.Config.Egress,
		Runtime:         sb.Runtime,
		Hostname:        sb.Config.Hostname,
		Ip:              sb.IP,
		CreatedAtUnixMs: sb.CreatedAt.UnixMilli(),
		Snapshotter:     sb.Config.Snapshotter,
		Error:           sb.Error,
		ParentId:        sb.ParentID,
		FromCheckpoint:  sb.FromCheckpoint,
		MachineId:       sb.Config.MachineID,
		ExpiresAtUnixMs: unixMilli(d.ExpiresAt(sb)),
		TimeoutMs:       sb.Config.TimeoutMS,
		OnTimeout:       onTimeout(sb.Config.OnTimeout),
		EgressAllow:     sb.Config.EgressAllow,
		EgressDeny:      sb.Config.EgressDeny,
	}
}

func unixMilli(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

// onTimeout names the default action.
func onTimeout(s string) string {
	if s == "" {
		return daemon.OnTimeoutClose
	}
	return s
}

func (s *sandboxes) CreateSandbox(ctx context.Context, req *connect.Request[v1.CreateSandboxRequest]) (*connect.Response[v1.CreateSandboxResponse], error) {
	m := req.Msg
	start := time.Now()
	o := daemon.CreateOptions{Image: m.Image, Name: m.Name, Env: m.Env, Cwd: m.Cwd, Egress: m.Egress, Runtime: m.Runtime,
		Timeout: lifetimeTimeout(m.TimeoutMs), OnTimeout: m.OnTimeout,
		EgressAllow: m.EgressAllow, EgressDeny: m.EgressDeny}
	if r := m.Resources; r != nil {
		o.CPU, o.Memory, o.Pids, o.Disk = r.Cpu, r.Memory, r.Pids, r.Disk
	}
	sb, err := s.d.Create(ctx, o)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&v1.CreateSandboxResponse{Sandbox: toSandbox(s.d, sb), ReadyMs: float64(time.Since(start).Microseconds()) / 1000}), nil
}

func (s *sandboxes) GetSandbox(ctx context.Context, req *connect.Request[v1.GetSandboxRequest]) (*connect.Response[v1.GetSandboxResponse], error) {
	sb, err := s.d.Get(ctx, req.Msg.Sandbox)
	if err != nil {
		return nil, err
	}
	out := toSandbox(s.d, sb)
	creds, err := s.d.ListCredentials(ctx, sb.ID)
	if err != nil {
		return nil, err
	}
	for _, c := range creds {
		out.Credentials = append(out.Credentials, c.Name)
	}
	return connect.NewResponse(&v1.GetSandboxResponse{Sandbox: out}), nil
}

func (s *sandboxes) ListSandboxes(ctx context.Context, req *connect.Request[v1.ListSandboxesRequest]) (*connect.Response[v1.ListSandboxesResponse], error) {
	list, next, err := s.d.ListPage(ctx, req.Msg.All, pageOf(req.Msg))
	if err != nil {
		return nil, err
	}
	out := &v1.ListSandboxesResponse{NextPageToken: next}
	for _, sb := range list {
		out.Sandboxes = append(out.Sandboxes, toSandbox(s.d, sb))
	}
	return connect.NewResponse(out), nil
}

// pageRequest is a list request with pagination fields.
type pageRequest interface {
	GetPageSize() int32
	GetPageToken() string
}

// pageOf is the page a list request asks for (the store bounds it).
func pageOf(r pageRequest) store.Page {
	return store.Page{Size: int(r.GetPageSize()), Token: r.GetPageToken()}
}

func (s *sandboxes) DeleteSandbox(ctx context.Context, req *connect.Request[v1.DeleteSandboxRequest]) (*connect.Response[v1.DeleteSandboxResponse], error) {
	if err := s.d.Delete(ctx, req.Msg.Sandbox); err != nil {
		return nil, err
	}
	return connect.NewResponse(&v1.DeleteSandboxResponse{}), nil
}

// streamWriter sends each write as one stdout or stderr message. Writes from
// the two streams are serialised on the one response stream.
type streamWriter struct {
	mu     *sync.Mutex
	stream *connect.ServerStream[v1.ExecResponse]
	stderr bool
}

func (w streamWriter) Write(p []byte) (int, error) {
	b := append([]byte(nil), p...)
	msg := &v1.ExecResponse{Event: &v1.ExecResponse_Stdout{Stdout: b}}
	if w.stderr {
		msg = &v1.ExecResponse{Event: &v1.ExecResponse_Stderr{Stderr: b}}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.stream.Send(msg); err != nil {
		return 0, err
	}
	return len(p), nil
}

func (s *sandboxes) Exec(ctx context.Context, req *connect.Request[v1.ExecRequest], stream *connect.ServerStream[v1.ExecResponse]) error {
	m := req.Msg
	timeout, err := execTimeout(m.TimeoutMs)
	if err != nil {
		return err
	}
	o := daemon.ExecOptions{ExecRequest: agent.ExecRequest{Argv: m.Argv, Shell: m.Shell, Env: m.Env, Cwd: m.Cwd, Stdin: m.Stdin,
		Timeout: timeout}, NonReplayable: m.NonReplayable}
	if m.Background {
		pid, err := s.d.Start(ctx, m.Sandbox, o)
		if err != nil {
			return err
		}
		return stream.Send(&v1.ExecResponse{Event: &v1.ExecResponse_Started{Started: &v1.ExecStarted{Pid: int64(pid)}}})
	}
	var mu sync.Mutex
	res, err := s.d.Exec(ctx, m.Sandbox, o, streamWriter{mu: &mu, stream: stream}, streamWriter{mu: &mu, stream: stream, stderr: true})
	if err != nil {
		return err
	}
	mu.Lock()
	defer mu.Unlock()
	return stream.Send(&v1.ExecResponse{Event: &v1.ExecResponse_Exit{Exit: &v1.ExecExit{
		ExitCode: int32(res.ExitCode), Signal: res.Signal, DurationMs: float64(res.Duration.Microseconds()) / 1000,
		TimedOut: res.TimedOut, OomKilled: res.OOMKilled,
	}}})
}

func (s *sandboxes) ReadFile(ctx context.Context, req *connect.Request[v1.ReadFileRequest]) (*connect.Response[v1.ReadFileResponse], error) {
	data, err := s.d.ReadFile(ctx, req.Msg.Sandbox, req.Msg.Path)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&v1.ReadFileResponse{Data: data}), nil
}

func (s *sandboxes) WriteFile(ctx context.Context, req *connect.Request[v1.WriteFileRequest]) (*connect.Response[v1.WriteFileResponse], error) {
	if err := s.d.WriteFile(ctx, req.Msg.Sandbox, req.Msg.Path, req.Msg.Data, req.Msg.Mode); err != nil {
		return nil, err
	}
	return connect.NewResponse(&v1.WriteFileResponse{}), nil
}

func (s *sandboxes) ListFiles(ctx context.Context, req *connect.Request[v1.ListFilesRequest]) (*connect.Response[v1.ListFilesResponse], error) {
	files, err := s.d.ListFiles(ctx, req.Msg.Sandbox, req.Msg.Path)
	if err != nil {
		return nil, err
	}
	out := &v1.ListFilesResponse{}
	for _, f := range files {
		out.Files = append(out.Files, &v1.FileInfo{Name: f.Name, Size: f.Size, Mode: uint32(f.Mode), Dir: f.IsDir, MtimeUnixMs: f.ModTime.UnixMilli()})
	}
	return connect.NewResponse(out), nil
}

func (s *sandboxes) Events(ctx context.Context, req *connect.Request[v1.EventsRequest]) (*connect.Response[v1.EventsResponse], error) {
	evs, next, err := s.d.EventsPage(ctx, req.Msg.Sandbox, pageOf(req.Msg))
	if err != nil {
		return nil, err
	}
	out := &v1.EventsResponse{NextPageToken: next}
	for _, e := range evs {
		data, _ := json.Marshal(e.Data)
		out.Events = append(out.Events, &v1.Event{Seq: e.Seq, SandboxId: e.SandboxID, Type: e.Type, TimeUnixMs: e.Time.UnixMilli(), DataJson: string(data)})
	}
	return connect.NewResponse(out), nil
}
