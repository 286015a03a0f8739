package e2b

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"runtime/debug"

	"connectrpc.com/connect"

	"github.com/forkbox/forkbox/api/e2b/filesystem/filesystemconnect"
	"github.com/forkbox/forkbox/api/e2b/process/processconnect"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/store"
)

// maxRPCBytes bounds one envd RPC message (SendInput's stdin chunk).
const maxRPCBytes = 4 << 20

type sandboxKey struct{}

// sandboxOf is the sandbox an envd request was authenticated for.
func sandboxOf(ctx context.Context) *store.Sandbox {
	return ctx.Value(sandboxKey{}).(*store.Sandbox)
}

// envdRoutes serves envd for the sandbox each request names in
// E2b-Sandbox-Id, once X-Access-Token proves the caller holds that
// sandbox's access token. A sandbox that is gone answers 502, as E2B's
// proxy does (the SDKs read it as "the sandbox is not running").
func (s *Server) envdRoutes() http.Handler {
	opts := []connect.HandlerOption{
		connect.WithReadMaxBytes(maxRPCBytes),
		connect.WithInterceptors(connectErrors{log: s.log}),
		connect.WithRecover(func(ctx context.Context, spec connect.Spec, _ http.Header, p any) error {
			s.log.Error("panic in envd handler", "procedure", spec.Procedure, "panic", p, "stack", string(debug.Stack()))
			return connect.NewError(connect.CodeInternal, fmt.Errorf("internal error in %s (see the daemon log)", spec.Procedure))
		}),
	}
	mux := http.NewServeMux()
	mux.Handle(processconnect.NewProcessHandler(&processService{s: s}, opts...))
	mux.Handle(filesystemconnect.NewFilesystemHandler(&filesystemService{s: s}, opts...))
	mux.HandleFunc("GET /health", s.health)
	mux.HandleFunc("GET /files", s.download)
	mux.HandleFunc("POST /files", s.upload)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		fail(w, notServed(fmt.Sprintf("envd's %s %.128s", r.Method, r.URL.Path)))
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get(hdrSandboxID)
		if err := checkID("sandbox", id); err != nil {
			fail(w, err)
			return
		}
		if !s.accessTokenOK(id, r.Header.Get(hdrAccessToken)) {
			w.Header().Set("Connection", "close") // a refused caller keeps no connection
			writeError(w, http.StatusUnauthorized, fmt.Sprintf("invalid or missing access token for sandbox %s (X-Access-Token must be the envdAccessToken its create returned)", id))
			return
		}
		sb, err := s.liveSandbox(r.Context(), id)
		if err != nil {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadGateway)
			fmt.Fprintf(w, `{"sandboxId":%q,"message":"The sandbox was not found","code":502}`, id)
			return
		}
		if s.pauses.paused(sb.ID) {
			// Hibernated by a pause: this request wakes it (as any exec
			// would), and the processes that were attached reattach.
			if sb, _, err = s.wake(r.Context(), sb); err != nil {
				fail(w, err)
				return
			}
		}
		mux.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), sandboxKey{}, sb)))
	})
}

// health is envd's /health: 204 while the sandbox runs (or is hibernated:
// the next request wakes it), 502 otherwise.
func (s *Server) health(w http.ResponseWriter, r *http.Request) {
	sb := sandboxOf(r.Context())
	if sb.State == store.StateRunning || sb.State == store.StateHibernated {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	writeError(w, http.StatusBadGateway, fmt.Sprintf("sandbox %s is %s", sb.ID, sb.State))
}

// connectErrors converts error classes to Connect codes at the envd
// boundary.
type connectErrors struct{ log *slog.Logger }

func (c connectErrors) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		resp, err := next(ctx, req)
		if err != nil {
			c.log.Debug("envd request failed", "procedure", req.Spec().Procedure, "class", errdefs.ClassName(err), "err", err)
		}
		return resp, toConnect(err)
	}
}

func (c connectErrors) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (c connectErrors) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		err := next(ctx, conn)
		if err != nil {
			c.log.Debug("envd stream failed", "procedure", conn.Spec().Procedure, "class", errdefs.ClassName(err), "err", err)
		}
		return toConnect(err)
	}
}
