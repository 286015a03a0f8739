package server

import (
	"context"

	"connectrpc.com/connect"

	v1 "github.com/forkbox/forkbox/api/forkbox/v1"
)

func (s *sandboxes) GetPortURL(ctx context.Context, req *connect.Request[v1.GetPortURLRequest]) (*connect.Response[v1.GetPortURLResponse], error) {
	u, err := s.d.PortURL(ctx, req.Msg.Sandbox, int(req.Msg.Port))
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&v1.GetPortURLResponse{Url: u.URL, Token: u.Token, Host: u.Host, HostUrl: u.HostURL, PathUrl: u.PathURL}), nil
}
