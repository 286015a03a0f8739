package gateway

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/forkbox/forkbox/api/forkbox/v1/forkboxv1connect"
	"github.com/forkbox/forkbox/errdefs"
)

// unimplemented is the answer of a call that has no cluster meaning yet:
// never a silent success.
func unimplemented(call, instead string) error {
	return fmt.Errorf("%s is not available in cluster mode (forkbox serve --gateway): %s: %w", call, instead, errdefs.ErrNotImplemented)
}

// Every method of the three services is implemented here, with a
// cluster meaning or a clear refusal.
var (
	_ forkboxv1connect.SandboxServiceHandler     = (*sandboxes)(nil)
	_ forkboxv1connect.ImageServiceHandler       = (*images)(nil)
	_ forkboxv1connect.EnvironmentServiceHandler = (*environments)(nil)
)

type streamCtlKey struct{}

// withStreamControl lets the ExecPty handler end a caller's blocked
// Receive once the node's side has ended.
func withStreamControl(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == forkboxv1connect.SandboxServiceExecPtyProcedure {
			r = r.WithContext(context.WithValue(r.Context(), streamCtlKey{}, http.NewResponseController(w)))
		}
		next.ServeHTTP(w, r)
	})
}

// endReceive makes a blocked or later Receive of the caller's stream fail.
func endReceive(ctx context.Context) {
	if rc, ok := ctx.Value(streamCtlKey{}).(*http.ResponseController); ok {
		_ = rc.SetReadDeadline(time.Unix(1, 0))
	}
}
