// Package errconnect converts forkbox error classes to Connect codes and
// back. The server calls ToConnect once, at its boundary; clients call
// FromConnect on every error they receive. It is apart from errdefs so that
// the in-sandbox agent, which uses errdefs, does not link Connect.
package errconnect

import (
	"context"
	"errors"
	"log/slog"

	"connectrpc.com/connect"

	"github.com/forkbox/forkbox/errdefs"
)

var toCode = map[error]connect.Code{
	errdefs.ErrInvalidArgument:    connect.CodeInvalidArgument,
	errdefs.ErrNotFound:           connect.CodeNotFound,
	errdefs.ErrAlreadyExists:      connect.CodeAlreadyExists,
	errdefs.ErrFailedPrecondition: connect.CodeFailedPrecondition,
	errdefs.ErrUnavailable:        connect.CodeUnavailable,
	errdefs.ErrResourceExhausted:  connect.CodeResourceExhausted,
	errdefs.ErrPermissionDenied:   connect.CodePermissionDenied,
	errdefs.ErrUnauthenticated:    connect.CodeUnauthenticated,
	errdefs.ErrDeadlineExceeded:   connect.CodeDeadlineExceeded,
	errdefs.ErrCanceled:           connect.CodeCanceled,
	errdefs.ErrNotImplemented:     connect.CodeUnimplemented,
	errdefs.ErrInternal:           connect.CodeInternal,
	errdefs.ErrUnknown:            connect.CodeUnknown,
}

// ToConnect converts err to a *connect.Error whose code is err's class. It is
// called once, at the API server boundary.
func ToConnect(err error) error {
	if err == nil {
		return nil
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		return err
	}
	switch {
	case errors.Is(err, context.Canceled):
		return connect.NewError(connect.CodeCanceled, err)
	case errors.Is(err, context.DeadlineExceeded):
		return connect.NewError(connect.CodeDeadlineExceeded, err)
	}
	return connect.NewError(toCode[errdefs.Class(err)], err)
}

// FromConnect converts an error returned by a Connect client back into an
// error of the matching class, keeping the server's message.
func FromConnect(err error) error {
	if err == nil {
		return nil
	}
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return err
	}
	for class, code := range toCode {
		if code == ce.Code() {
			return &remoteError{msg: ce.Message(), class: class}
		}
	}
	return &remoteError{msg: ce.Message(), class: errdefs.ErrUnknown}
}

// remoteError is an error that came over the API: the server's message, with
// its class restored so that errdefs.Is* work on the client side.
type remoteError struct {
	msg   string
	class error
}

func (e *remoteError) Error() string { return e.msg }
func (e *remoteError) Unwrap() error { return e.class }

// Interceptor converts every error leaving a handler to a Connect error of
// its class (ToConnect; errors that already are Connect errors pass as they
// are), logging failed unary calls at debug level: the one boundary where
// classes become codes, for the daemon's API and the gateway's alike.
func Interceptor(log *slog.Logger) connect.Interceptor { return interceptor{log: log} }

type interceptor struct{ log *slog.Logger }

func (e interceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		resp, err := next(ctx, req)
		if err != nil {
			e.log.Debug("request failed", "procedure", req.Spec().Procedure, "class", errdefs.ClassName(err), "err", err)
		}
		return resp, ToConnect(err)
	}
}

func (e interceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (e interceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		return ToConnect(next(ctx, conn))
	}
}
