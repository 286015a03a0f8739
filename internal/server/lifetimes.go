package server

import (
	"context"

	"connectrpc.com/connect"

	v1 "github.com/forkbox/forkbox/api/forkbox/v1"
)

func (s *sandboxes) SetTimeout(ctx context.Context, req *connect.Request[v1.SetTimeoutRequest]) (*connect.Response[v1.SetTimeoutResponse], error) {
	sb, err := s.d.SetTimeout(ctx, req.Msg.Sandbox, lifetimeTimeout(req.Msg.TimeoutMs))
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&v1.SetTimeoutResponse{Sandbox: toSandbox(s.d, sb)}), nil
}
