package client

import (
	"context"
	"errors"
	"io"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	v1 "github.com/forkbox/forkbox/api/forkbox/v1"
	"github.com/forkbox/forkbox/api/forkbox/v1/forkboxv1connect"
	"github.com/forkbox/forkbox/errdefs"
)

// execService prints one chunk of stdout, then waits for the caller to
// go away (the exec stopped) before it would send the exit.
type execService struct {
	forkboxv1connect.UnimplementedSandboxServiceHandler
	stopped chan struct{}
}

func (e *execService) Exec(ctx context.Context, _ *connect.Request[v1.ExecRequest], stream *connect.ServerStream[v1.ExecResponse]) error {
	if err := stream.Send(&v1.ExecResponse{Event: &v1.ExecResponse_Stdout{Stdout: []byte("hello\n")}}); err != nil {
		return err
	}
	select {
	case <-ctx.Done():
		close(e.stopped)
		return ctx.Err()
	case <-time.After(30 * time.Second):
		return stream.Send(&v1.ExecResponse{Event: &v1.ExecResponse_Exit{Exit: &v1.ExecExit{}}})
	}
}

type brokenWriter struct{ short bool }

func (b brokenWriter) Write(p []byte) (int, error) {
	if b.short {
		return len(p) - 1, nil
	}
	return 0, errors.New("disk full")
}

// A writer that fails (or writes short) fails the exec with the writer's
// error, and the exec is stopped: its output would be incomplete, and an
// exit code beside it would say otherwise.
func TestExecOutputWriteFails(t *testing.T) {
	for _, tc := range []struct {
		name string
		w    io.Writer
		want string
	}{{"error", brokenWriter{}, "disk full"}, {"short", brokenWriter{short: true}, "short write"}} {
		t.Run(tc.name, func(t *testing.T) {
			svc := &execService{stopped: make(chan struct{})}
			_, h := forkboxv1connect.NewSandboxServiceHandler(svc)
			srv := httptest.NewServer(h)
			defer srv.Close()
			c := &Client{URL: srv.URL}
			c.init()
			sb := &Sandbox{c: c, ID: "sb-1"}
			res, err := sb.Exec(context.Background(), ExecOptions{Shell: "echo hello", Stdout: tc.w})
			if err == nil || !errors.Is(err, errdefs.ErrInternal) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Exec = %+v, %v; want an Internal error naming %q", res, err, tc.want)
			}
			select {
			case <-svc.stopped:
			case <-time.After(30 * time.Second):
				t.Error("the exec was not stopped after its output could not be written")
			}
		})
	}
}
