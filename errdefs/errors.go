// Package errdefs defines forkbox's small, fixed set of error classes.
//
// An error gets its class where it starts, by wrapping one of the sentinel
// errors below with %w and some context:
//
//	return fmt.Errorf("sandbox %q: %w", id, errdefs.ErrNotFound)
//
// Callers test the class, never the message: errdefs.IsNotFound(err). The
// API server maps classes to Connect codes at one boundary (ToConnect) and the
// clients map them back (FromConnect), so a class survives the round trip.
package errdefs

import "errors"

// The error classes. Their names follow containerd/errdefs and gRPC codes.
var (
	ErrUnknown            = errors.New("unknown")
	ErrInvalidArgument    = errors.New("invalid argument")
	ErrNotFound           = errors.New("not found")
	ErrAlreadyExists      = errors.New("already exists")
	ErrFailedPrecondition = errors.New("failed precondition")
	ErrUnavailable        = errors.New("unavailable")
	ErrResourceExhausted  = errors.New("resource exhausted")
	ErrPermissionDenied   = errors.New("permission denied")
	ErrUnauthenticated    = errors.New("unauthenticated")
	ErrDeadlineExceeded   = errors.New("deadline exceeded")
	ErrCanceled           = errors.New("canceled")
	ErrNotImplemented     = errors.New("not implemented")
	ErrInternal           = errors.New("internal")
)

// IsInvalidArgument reports whether err is of class InvalidArgument.
func IsInvalidArgument(err error) bool { return errors.Is(err, ErrInvalidArgument) }

// IsNotFound reports whether err is of class NotFound.
func IsNotFound(err error) bool { return errors.Is(err, ErrNotFound) }

// IsAlreadyExists reports whether err is of class AlreadyExists.
func IsAlreadyExists(err error) bool { return errors.Is(err, ErrAlreadyExists) }

// IsFailedPrecondition reports whether err is of class FailedPrecondition.
func IsFailedPrecondition(err error) bool { return errors.Is(err, ErrFailedPrecondition) }

// IsUnavailable reports whether err is of class Unavailable.
func IsUnavailable(err error) bool { return errors.Is(err, ErrUnavailable) }

// IsResourceExhausted reports whether err is of class ResourceExhausted.
func IsResourceExhausted(err error) bool { return errors.Is(err, ErrResourceExhausted) }

// IsPermissionDenied reports whether err is of class PermissionDenied.
func IsPermissionDenied(err error) bool { return errors.Is(err, ErrPermissionDenied) }

// IsUnauthenticated reports whether err is of class Unauthenticated.
func IsUnauthenticated(err error) bool { return errors.Is(err, ErrUnauthenticated) }

// IsDeadlineExceeded reports whether err is of class DeadlineExceeded.
func IsDeadlineExceeded(err error) bool { return errors.Is(err, ErrDeadlineExceeded) }

// IsNotImplemented reports whether err is of class NotImplemented.
func IsNotImplemented(err error) bool { return errors.Is(err, ErrNotImplemented) }

// classes lists every class in a fixed order, for lookups by name.
var classes = []error{
	ErrInvalidArgument, ErrNotFound, ErrAlreadyExists, ErrFailedPrecondition,
	ErrUnavailable, ErrResourceExhausted, ErrPermissionDenied, ErrUnauthenticated,
	ErrDeadlineExceeded, ErrCanceled, ErrNotImplemented, ErrInternal,
}

// Class returns the sentinel class of err, or ErrUnknown.
func Class(err error) error {
	for _, c := range classes {
		if errors.Is(err, c) {
			return c
		}
	}
	return ErrUnknown
}

// ClassName returns the CamelCase name of err's class ("NotFound", ...), as
// shown to users next to the message.
func ClassName(err error) string {
	switch Class(err) {
	case ErrInvalidArgument:
		return "InvalidArgument"
	case ErrNotFound:
		return "NotFound"
	case ErrAlreadyExists:
		return "AlreadyExists"
	case ErrFailedPrecondition:
		return "FailedPrecondition"
	case ErrUnavailable:
		return "Unavailable"
	case ErrResourceExhausted:
		return "ResourceExhausted"
	case ErrPermissionDenied:
		return "PermissionDenied"
	case ErrUnauthenticated:
		return "Unauthenticated"
	case ErrDeadlineExceeded:
		return "DeadlineExceeded"
	case ErrCanceled:
		return "Canceled"
	case ErrNotImplemented:
		return "NotImplemented"
	case ErrInternal:
		return "Internal"
	}
	return "Unknown"
}

// FromClassName returns an error of the class named name (as ClassName
// gives it) with message msg: for classes that travel as names.
func FromClassName(name, msg string) error {
	for _, c := range classes {
		if ClassName(c) == name {
			return &classed{msg: msg, class: c}
		}
	}
	return &classed{msg: msg, class: ErrUnknown}
}

type classed struct {
	msg   string
	class error
}

func (e *classed) Error() string { return e.msg }
func (e *classed) Unwrap() error { return e.class }
