package agent

import (
	"errors"
	"fmt"
	"io/fs"
	"syscall"
	"unicode/utf8"

	"github.com/forkbox/forkbox/errdefs"
)

// wireError is an error frame's payload: the error's class and message.
type wireError struct {
	Class   string `json:"class"`
	Message string `json:"message"`
}

// allClasses lists the classes a name can map back to.
var allClasses = []error{
	errdefs.ErrInvalidArgument, errdefs.ErrNotFound, errdefs.ErrAlreadyExists,
	errdefs.ErrFailedPrecondition, errdefs.ErrUnavailable, errdefs.ErrResourceExhausted,
	errdefs.ErrPermissionDenied, errdefs.ErrUnauthenticated, errdefs.ErrDeadlineExceeded,
	errdefs.ErrCanceled, errdefs.ErrNotImplemented, errdefs.ErrInternal, errdefs.ErrUnknown,
}

// ClassFromName is the reverse of errdefs.ClassName: it returns the class
// sentinel called name, or errdefs.ErrUnknown.
func ClassFromName(name string) error {
	for _, c := range allClasses {
		if errdefs.ClassName(c) == name {
			return c
		}
	}
	return errdefs.ErrUnknown
}

// remoteError is an error that came from the agent: its message, with its
// class restored so that errdefs.Is* work on the client side.
type remoteError struct {
	msg   string
	class error
}

func (e *remoteError) Error() string { return "agent: " + e.msg }
func (e *remoteError) Unwrap() error { return e.class }

// maxErrorMessage bounds an agent's error message as the host keeps it (in
// the ledger, in replies): the agent is the sandbox's, and may send up to a
// frame's megabyte.
const maxErrorMessage = 4 << 10

func (w wireError) err() error {
	return &remoteError{msg: clip(w.Message, maxErrorMessage), class: ClassFromName(w.Class)}
}

// clip cuts s to at most n bytes, at a rune boundary, saying so.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + fmt.Sprintf("… (%d bytes more)", len(s)-cut)
}

// tail keeps the last n bytes of s at most, from a rune boundary.
func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	from := len(s) - n
	for from < len(s) && !utf8.RuneStart(s[from]) {
		from++
	}
	return s[from:]
}

// osErr gives an error from the os package its class.
func osErr(op, path string, err error) error {
	var class error
	switch {
	case errors.Is(err, fs.ErrNotExist), errors.Is(err, syscall.ENOTDIR):
		class = errdefs.ErrNotFound
	case errors.Is(err, fs.ErrPermission), errors.Is(err, syscall.EROFS):
		class = errdefs.ErrPermissionDenied
	case errors.Is(err, fs.ErrExist):
		class = errdefs.ErrAlreadyExists
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT), errors.Is(err, syscall.EFBIG),
		errors.Is(err, syscall.EAGAIN), errors.Is(err, syscall.ENOMEM): // fork at the pids or memory limit
		class = errdefs.ErrResourceExhausted
	case errors.Is(err, syscall.EISDIR), errors.Is(err, syscall.ENAMETOOLONG):
		class = errdefs.ErrInvalidArgument
	default:
		class = errdefs.ErrInternal
	}
	return fmt.Errorf("%s %s: %v: %w", op, path, unwrapPathErr(err), class)
}

func unwrapPathErr(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
