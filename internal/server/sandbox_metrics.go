package server

import (
	"context"

	"connectrpc.com/connect"

	v1 "github.com/forkbox/forkbox/api/forkbox/v1"
	"github.com/forkbox/forkbox/internal/daemon"
)

func toMetrics(m daemon.Metrics) *v1.SandboxMetrics {
	return &v1.SandboxMetrics{
		SandboxId: m.Sandbox.ID, Name: m.Sandbox.Name, State: string(m.Sandbox.State), Runtime: m.Sandbox.Runtime,
		TimeUnixMs: m.Time.UnixMilli(), CpuSeconds: m.CPUSeconds, CpuLimit: m.CPULimit,
		MemoryBytes: m.MemoryBytes, MemoryLimitBytes: m.MemoryLimit, DiskBytes: m.DiskBytes, DiskLimitBytes: m.DiskLimit,
		NetRxBytes: int64(m.NetRxBytes), NetTxBytes: int64(m.NetTxBytes), Pids: m.Pids, PidsLimit: m.PidsLimit,
		Unavailable: m.Unavailable,
	}
}

func (s *sandboxes) GetSandboxMetrics(ctx context.Context, req *connect.Request[v1.GetSandboxMetricsRequest]) (*connect.Response[v1.GetSandboxMetricsResponse], error) {
	list, err := s.d.SandboxMetrics(ctx, req.Msg.Sandbox)
	if err != nil {
		return nil, err
	}
	out := &v1.GetSandboxMetricsResponse{}
	for _, m := range list {
		out.Metrics = append(out.Metrics, toMetrics(m))
	}
	return connect.NewResponse(out), nil
}
