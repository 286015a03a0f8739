package errdefs

import (
	"context"
	"errors"

	"connectrpc.com/connect"
)

var toCode = map[error]connect.Code{
	ErrInvalidArgument:    connect.CodeInvalidArgument,
	ErrNotFound:           connect.CodeNotFound,
	ErrAlreadyExists:      connect.CodeAlreadyExists,
	ErrFailedPrecondition: connect.CodeFailedPrecondition,
	ErrUnavailable:        connect.CodeUnavailable,
	ErrResourceExhausted:  connect.CodeResourceExhausted,
	ErrPermissionDenied:   connect.CodePermissionDenied,
	ErrUnauthenticated:    connect.CodeUnauthenticated,
	ErrDeadlineExceeded:   connect.CodeDeadlineExceeded,
	ErrCanceled:           connect.CodeCanceled,
	ErrNotImplemented:     connect.CodeUnimplemented,
	ErrInternal:           connect.CodeInternal,
	ErrUnknown:            connect.CodeUnknown,
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
	return connect.NewError(toCode[Class(err)], err)
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
	return &remoteError{msg: ce.Message(), class: ErrUnknown}
}

// remoteError is an error that came over the API: the server's message, with
// its class restored so that errdefs.Is* work on the client side.
type remoteError struct {
	msg   string
	class error
}

func (e *remoteError) Error() string { return e.msg }
func (e *remoteError) Unwrap() error { return e.class }
