package client

import (
	"context"
	"time"

	"connectrpc.com/connect"

	v1 "github.com/forkbox/forkbox/api/forkbox/v1"
	"github.com/forkbox/forkbox/errdefs/errconnect"
)

// SetTimeout sets the sandbox's deadline to now + d (E2B's setTimeout); 0
// removes its own timeout. The daemon's --max-lifetime may clamp it: the
// effective deadline is in s.Info afterwards (see ExpiresAt).
func (s *Sandbox) SetTimeout(ctx context.Context, d time.Duration) error {
	resp, err := s.c.sbx.SetTimeout(ctx, connect.NewRequest(&v1.SetTimeoutRequest{Sandbox: s.ID, TimeoutMs: durationMs(d)}))
	if err != nil {
		return errconnect.FromConnect(err)
	}
	s.Info = resp.Msg.Sandbox
	return nil
}

// ExpiresAt is when the sandbox expires, as of its last info (the zero
// time: never, unless the daemon's idle timeout applies).
func (s *Sandbox) ExpiresAt() time.Time {
	if s.Info == nil || s.Info.ExpiresAtUnixMs == 0 {
		return time.Time{}
	}
	return time.UnixMilli(s.Info.ExpiresAtUnixMs)
}

// durationMs is d in milliseconds, rounded up so that a positive d stays
// positive.
func durationMs(d time.Duration) int64 {
	if d <= 0 {
		return d.Milliseconds()
	}
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}
