package server

import (
	"context"

	"connectrpc.com/connect"

	v1 "github.com/forkbox/forkbox/api/forkbox/v1"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/daemon"
	"github.com/forkbox/forkbox/internal/store"
)

func toCheckpoint(ck *store.Checkpoint, sandboxName string) *v1.Checkpoint {
	return &v1.Checkpoint{Id: ck.ID, SandboxId: ck.SandboxID, SandboxName: sandboxName, Tag: ck.Tag,
		CreatedAtUnixMs: ck.CreatedAt.UnixMilli(), Size: ck.Size, Kind: ck.Kind, Image: ck.Image, CaptureMs: ck.CaptureMS, FlushMs: ck.FlushMS}
}

func fromOverrides(o *v1.Overrides) daemon.Overrides {
	if o == nil {
		return daemon.Overrides{}
	}
	out := daemon.Overrides{Env: o.Env, Cwd: o.Cwd, Egress: o.Egress, Name: o.Name, Timeout: lifetimeTimeout(o.TimeoutMs), OnTimeout: o.OnTimeout,
		EgressAllow: o.EgressAllow, EgressDeny: o.EgressDeny}
	if r := o.Resources; r != nil {
		out.CPU, out.Memory, out.Pids, out.Disk = r.Cpu, r.Memory, r.Pids, r.Disk
	}
	return out
}

func (s *sandboxes) name(ctx context.Context, id string) string {
	if sb, err := s.d.Get(ctx, id); err == nil {
		return sb.Name
	}
	return ""
}

func (s *sandboxes) SetEgress(ctx context.Context, req *connect.Request[v1.SetEgressRequest]) (*connect.Response[v1.SetEgressResponse], error) {
	m := req.Msg
	sb, err := s.d.SetEgress(ctx, m.Sandbox, daemon.EgressOptions{Egress: m.Egress, Allow: m.EgressAllow, Deny: m.EgressDeny})
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&v1.SetEgressResponse{Sandbox: toSandbox(s.d, sb)}), nil
}

func (s *sandboxes) PauseSandbox(ctx context.Context, req *connect.Request[v1.PauseSandboxRequest]) (*connect.Response[v1.PauseSandboxResponse], error) {
	sb, err := s.d.Pause(ctx, req.Msg.Sandbox)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&v1.PauseSandboxResponse{Sandbox: toSandbox(s.d, sb)}), nil
}

func (s *sandboxes) UnpauseSandbox(ctx context.Context, req *connect.Request[v1.UnpauseSandboxRequest]) (*connect.Response[v1.UnpauseSandboxResponse], error) {
	sb, err := s.d.Unpause(ctx, req.Msg.Sandbox)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&v1.UnpauseSandboxResponse{Sandbox: toSandbox(s.d, sb)}), nil
}

func (s *sandboxes) Checkpoint(ctx context.Context, req *connect.Request[v1.CheckpointRequest]) (*connect.Response[v1.CheckpointResponse], error) {
	ck, err := s.d.CheckpointWith(ctx, req.Msg.Sandbox, req.Msg.Tag, req.Msg.Memory)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&v1.CheckpointResponse{Checkpoint: toCheckpoint(ck, s.name(ctx, ck.SandboxID))}), nil
}

func (s *sandboxes) ListCheckpoints(ctx context.Context, req *connect.Request[v1.ListCheckpointsRequest]) (*connect.Response[v1.ListCheckpointsResponse], error) {
	cks, next, err := s.d.ListCheckpointsPage(ctx, req.Msg.Sandbox, pageOf(req.Msg))
	if err != nil {
		return nil, err
	}
	out := &v1.ListCheckpointsResponse{NextPageToken: next}
	for _, ck := range cks {
		out.Checkpoints = append(out.Checkpoints, toCheckpoint(ck, s.name(ctx, ck.SandboxID)))
	}
	return connect.NewResponse(out), nil
}

func (s *sandboxes) DeleteCheckpoint(ctx context.Context, req *connect.Request[v1.DeleteCheckpointRequest]) (*connect.Response[v1.DeleteCheckpointResponse], error) {
	if err := s.d.DeleteCheckpoint(ctx, req.Msg.Checkpoint); err != nil {
		return nil, err
	}
	return connect.NewResponse(&v1.DeleteCheckpointResponse{}), nil
}

func forkOptions(m *v1.ForkRequest) daemon.ForkOptions {
	return daemon.ForkOptions{Source: m.Sandbox, Tag: m.Tag, Count: int(m.Count), Overrides: fromOverrides(m.Overrides),
		Credentials: m.Credentials, FromCheckpoint: m.FromCheckpoint, BestEffort: m.BestEffort, Memory: m.Memory}
}

func (s *sandboxes) toForkChild(c daemon.ForkChild) *v1.ForkChild {
	fc := &v1.ForkChild{StartMs: c.StartMS}
	if c.Sandbox != nil {
		fc.Sandbox = toSandbox(s.d, c.Sandbox)
	}
	if c.Err != nil {
		fc.Error, fc.ErrorClass = c.Err.Error(), errdefs.ClassName(c.Err)
	}
	return fc
}

func (s *sandboxes) Fork(ctx context.Context, req *connect.Request[v1.ForkRequest]) (*connect.Response[v1.ForkResponse], error) {
	res, err := s.d.Fork(ctx, forkOptions(req.Msg))
	if err != nil {
		return nil, err
	}
	out := &v1.ForkResponse{Checkpoint: toCheckpoint(res.Checkpoint, s.name(ctx, res.Checkpoint.SandboxID)),
		Captured: res.Captured, CaptureMs: res.CaptureMS, FlushMs: res.Checkpoint.FlushMS, TotalMs: res.TotalMS,
		SourceDowntimeMs: res.SourceDowntimeMS}
	for _, c := range res.Children {
		out.Children = append(out.Children, s.toForkChild(c))
	}
	return connect.NewResponse(out), nil
}

// ForkStream sends the capture, then each child as the daemon reports it.
// A send that fails (the client went away) stops the sending; the children
// still start, as with a unary Fork whose caller goes away.
func (s *sandboxes) ForkStream(ctx context.Context, req *connect.Request[v1.ForkRequest], stream *connect.ServerStream[v1.ForkStreamResponse]) error {
	var sendErr error
	send := func(m *v1.ForkStreamResponse) {
		if sendErr == nil {
			sendErr = stream.Send(m)
		}
	}
	count := max(req.Msg.Count, 1)
	res, err := s.d.ForkStream(ctx, forkOptions(req.Msg), daemon.ForkEvents{
		Captured: func(r *daemon.ForkResult) {
			send(&v1.ForkStreamResponse{Event: &v1.ForkStreamResponse_Captured{Captured: &v1.ForkCaptured{
				Checkpoint: toCheckpoint(r.Checkpoint, s.name(ctx, r.Checkpoint.SandboxID)), Captured: r.Captured,
				CaptureMs: r.CaptureMS, FlushMs: r.Checkpoint.FlushMS, Count: count}}})
		},
		Child: func(i int, c daemon.ForkChild) {
			send(&v1.ForkStreamResponse{Event: &v1.ForkStreamResponse_Child{Child: &v1.ForkStreamChild{Index: int32(i), Child: s.toForkChild(c)}}})
		},
	})
	if err != nil {
		return err
	}
	done := &v1.ForkDone{TotalMs: res.TotalMS}
	for _, c := range res.Children {
		if c.Sandbox != nil {
			done.Started++
		} else {
			done.Failed++
		}
	}
	send(&v1.ForkStreamResponse{Event: &v1.ForkStreamResponse_Done{Done: done}})
	return sendErr
}

func (s *sandboxes) RestoreSnapshot(ctx context.Context, req *connect.Request[v1.RestoreSnapshotRequest]) (*connect.Response[v1.RestoreSnapshotResponse], error) {
	sb, err := s.d.RestoreSnapshot(ctx, req.Msg.Checkpoint, fromOverrides(req.Msg.Overrides), req.Msg.Credentials)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&v1.RestoreSnapshotResponse{Sandbox: toSandbox(s.d, sb)}), nil
}

func (s *sandboxes) Resume(ctx context.Context, req *connect.Request[v1.ResumeRequest]) (*connect.Response[v1.ResumeResponse], error) {
	sb, ck, replayed, err := s.d.Resume(ctx, req.Msg.Session)
	if err != nil {
		return nil, err
	}
	out := &v1.ResumeResponse{Sandbox: toSandbox(s.d, sb), Checkpoint: toCheckpoint(ck, sb.Name)}
	for _, r := range replayed {
		re := &v1.ReplayedExec{ExecId: r.ExecID, Argv: r.Argv, Shell: r.Shell, Skipped: r.Skipped, SkipReason: r.SkipReason,
			ExitCode: int32(r.ExitCode)}
		if r.Err != nil {
			re.Error = r.Err.Error()
		}
		out.Replayed = append(out.Replayed, re)
	}
	return connect.NewResponse(out), nil
}

func toCredential(c *store.Credential) *v1.Credential {
	return &v1.Credential{Name: c.Name, Env: c.Env, File: c.File, PerFork: c.PerFork, UpdatedAtUnixMs: c.UpdatedAt.UnixMilli()}
}

func (s *sandboxes) SetCredential(ctx context.Context, req *connect.Request[v1.SetCredentialRequest]) (*connect.Response[v1.SetCredentialResponse], error) {
	c := req.Msg.Credential
	if c == nil {
		c = &v1.Credential{}
	}
	cred, err := s.d.SetCredential(ctx, req.Msg.Sandbox, daemon.CredentialSpec{Name: c.Name, Env: c.Env, File: c.File, PerFork: c.PerFork}, req.Msg.Value)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&v1.SetCredentialResponse{Credential: toCredential(cred)}), nil
}

func (s *sandboxes) ListCredentials(ctx context.Context, req *connect.Request[v1.ListCredentialsRequest]) (*connect.Response[v1.ListCredentialsResponse], error) {
	creds, err := s.d.ListCredentials(ctx, req.Msg.Sandbox)
	if err != nil {
		return nil, err
	}
	out := &v1.ListCredentialsResponse{}
	for _, c := range creds {
		out.Credentials = append(out.Credentials, toCredential(c))
	}
	return connect.NewResponse(out), nil
}

func (s *sandboxes) DeleteCredential(ctx context.Context, req *connect.Request[v1.DeleteCredentialRequest]) (*connect.Response[v1.DeleteCredentialResponse], error) {
	if err := s.d.DeleteCredential(ctx, req.Msg.Sandbox, req.Msg.Name); err != nil {
		return nil, err
	}
	return connect.NewResponse(&v1.DeleteCredentialResponse{}), nil
}

func (s *sandboxes) HibernateSandbox(ctx context.Context, req *connect.Request[v1.HibernateSandboxRequest]) (*connect.Response[v1.HibernateSandboxResponse], error) {
	sb, err := s.d.Hibernate(ctx, req.Msg.Sandbox)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&v1.HibernateSandboxResponse{Sandbox: toSandbox(s.d, sb)}), nil
}

func (s *sandboxes) WakeSandbox(ctx context.Context, req *connect.Request[v1.WakeSandboxRequest]) (*connect.Response[v1.WakeSandboxResponse], error) {
	sb, err := s.d.Wake(ctx, req.Msg.Sandbox)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&v1.WakeSandboxResponse{Sandbox: toSandbox(s.d, sb)}), nil
}
