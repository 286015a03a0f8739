package server

import (
	"context"
	"fmt"
	"sync"
	"time"

	"connectrpc.com/connect"

	v1 "github.com/forkbox/forkbox/api/forkbox/v1"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/daemon"
)

type environments struct{ d *daemon.Daemon }

func fromDefinition(p *v1.EnvironmentDefinition) (daemon.EnvDefinition, error) {
	if p == nil {
		return daemon.EnvDefinition{}, errdefs.FromClassName("InvalidArgument", "an environment definition is required")
	}
	def := daemon.EnvDefinition{Name: p.Name, Image: p.Image, Env: p.Env, Cwd: p.Cwd, Runtime: p.Runtime, Egress: p.Egress,
		MaxAge: time.Duration(p.MaxAgeSeconds) * time.Second, PoolSize: int(p.PoolSize), SetupHash: p.SetupHash}
	if r := p.Resources; r != nil {
		def.CPU, def.Memory, def.Pids, def.Disk = r.Cpu, r.Memory, r.Pids, r.Disk
	}
	for _, s := range p.Steps {
		def.Steps = append(def.Steps, daemon.SetupStep{Run: s.Run, WritePath: s.WritePath, WriteContent: s.WriteContent, WriteMode: s.WriteMode})
	}
	if st := p.Start; st != nil {
		if st.ReadyTimeoutMs < 0 {
			return def, fmt.Errorf("start: ready timeout %d ms is negative: %w", st.ReadyTimeoutMs, errdefs.ErrInvalidArgument)
		}
		def.Start = &daemon.StartCommand{Run: st.Run, ReadyPort: int(st.ReadyPort), ReadyCommand: st.ReadyCommand,
			ReadyTimeout: time.Duration(min(st.ReadyTimeoutMs, int64(time.Hour/time.Millisecond))) * time.Millisecond}
	}
	return def, nil
}

func toDefinition(def daemon.EnvDefinition) *v1.EnvironmentDefinition {
	p := &v1.EnvironmentDefinition{Name: def.Name, Image: def.Image, Env: def.Env, Cwd: def.Cwd, Runtime: def.Runtime, Egress: def.Egress,
		MaxAgeSeconds: int64(def.MaxAge / time.Second), PoolSize: int32(def.PoolSize), SetupHash: def.SetupHash,
		Resources: &v1.Resources{Cpu: def.CPU, Memory: def.Memory, Pids: def.Pids, Disk: def.Disk}}
	for _, s := range def.Steps {
		p.Steps = append(p.Steps, &v1.SetupStep{Run: s.Run, WritePath: s.WritePath, WriteContent: s.WriteContent, WriteMode: s.WriteMode})
	}
	if st := def.Start; st != nil {
		p.Start = &v1.StartCommand{Run: st.Run, ReadyPort: int32(st.ReadyPort), ReadyCommand: st.ReadyCommand,
			ReadyTimeoutMs: st.ReadyTimeout.Milliseconds()}
	}
	return p
}

func toEnvironment(st *daemon.EnvStatus) *v1.Environment {
	e := &v1.Environment{Definition: toDefinition(st.Def), Hash: st.Rec.Hash, Checkpoint: st.Rec.Checkpoint,
		BuildMs: st.Rec.BuildMS, State: st.Rec.State, Error: st.Rec.Error, PoolReady: int32(st.PoolReady), CachedSteps: int32(st.Rec.CachedSteps)}
	if !st.Rec.BuiltAt.IsZero() {
		e.BuiltAtUnixMs = st.Rec.BuiltAt.UnixMilli()
	}
	return e
}

func (s *environments) BuildEnvironment(ctx context.Context, req *connect.Request[v1.BuildEnvironmentRequest], stream *connect.ServerStream[v1.BuildProgress]) error {
	def, err := fromDefinition(req.Msg.Definition)
	if err != nil {
		return err
	}
	var mu sync.Mutex
	send := func(p daemon.EnvProgress) {
		mu.Lock()
		defer mu.Unlock()
		_ = stream.Send(&v1.BuildProgress{Phase: p.Phase, Step: int32(p.Step), Steps: int32(p.Steps), Message: p.Message,
			Output: p.Output, ExitCode: int32(p.ExitCode)})
	}
	st, _, err := s.d.BuildEnvironment(ctx, def, false, send)
	if err != nil {
		return err
	}
	mu.Lock()
	defer mu.Unlock()
	return stream.Send(&v1.BuildProgress{Phase: "done", Environment: toEnvironment(st)})
}

func (s *environments) EnvironmentSandbox(ctx context.Context, req *connect.Request[v1.EnvironmentSandboxRequest]) (*connect.Response[v1.EnvironmentSandboxResponse], error) {
	var def *daemon.EnvDefinition
	if req.Msg.Definition != nil {
		d, err := fromDefinition(req.Msg.Definition)
		if err != nil {
			return nil, err
		}
		def = &d
	}
	var res *daemon.EnvSandboxResult
	var err error
	switch {
	case req.Msg.NoBuild && def != nil:
		return nil, fmt.Errorf("no_build takes an environment name, not a definition: %w", errdefs.ErrInvalidArgument)
	case req.Msg.NoBuild:
		res, err = s.d.EnvironmentSandboxBuilt(ctx, req.Msg.Name, fromOverrides(req.Msg.Overrides))
	default:
		res, err = s.d.EnvironmentSandbox(ctx, def, req.Msg.Name, fromOverrides(req.Msg.Overrides))
	}
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&v1.EnvironmentSandboxResponse{Sandbox: toSandbox(s.d, res.Sandbox), Environment: toEnvironment(res.Env),
		FromPool: res.FromPool, HandoverMs: res.HandoverMS, Built: res.Built}), nil
}

func (s *environments) GetEnvironment(ctx context.Context, req *connect.Request[v1.GetEnvironmentRequest]) (*connect.Response[v1.GetEnvironmentResponse], error) {
	st, err := s.d.GetEnvironment(ctx, req.Msg.Name)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&v1.GetEnvironmentResponse{Environment: toEnvironment(st)}), nil
}

func (s *environments) ListEnvironments(ctx context.Context, req *connect.Request[v1.ListEnvironmentsRequest]) (*connect.Response[v1.ListEnvironmentsResponse], error) {
	list, err := s.d.ListEnvironments(ctx)
	if err != nil {
		return nil, err
	}
	out := &v1.ListEnvironmentsResponse{}
	for _, st := range list {
		out.Environments = append(out.Environments, toEnvironment(st))
	}
	return connect.NewResponse(out), nil
}

func (s *environments) DeleteEnvironment(ctx context.Context, req *connect.Request[v1.DeleteEnvironmentRequest]) (*connect.Response[v1.DeleteEnvironmentResponse], error) {
	if err := s.d.DeleteEnvironment(ctx, req.Msg.Name); err != nil {
		return nil, err
	}
	return connect.NewResponse(&v1.DeleteEnvironmentResponse{}), nil
}

func (s *environments) BeginBuild(ctx context.Context, req *connect.Request[v1.BeginBuildRequest]) (*connect.Response[v1.BeginBuildResponse], error) {
	def, err := fromDefinition(req.Msg.Definition)
	if err != nil {
		return nil, err
	}
	st, builder, lease, err := s.d.BeginBuild(ctx, def)
	if err != nil {
		return nil, err
	}
	out := &v1.BeginBuildResponse{Lease: lease}
	if st != nil {
		out.Environment = toEnvironment(st)
	}
	if builder != nil {
		out.Builder = toSandbox(s.d, builder)
	}
	return connect.NewResponse(out), nil
}

func (s *environments) CompleteBuild(ctx context.Context, req *connect.Request[v1.CompleteBuildRequest]) (*connect.Response[v1.CompleteBuildResponse], error) {
	st, err := s.d.CompleteBuild(ctx, req.Msg.Lease, req.Msg.Ok, req.Msg.Error)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&v1.CompleteBuildResponse{Environment: toEnvironment(st)}), nil
}
