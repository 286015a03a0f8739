package e2b

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/errdefs/errconnect"
)

// apiError is E2B's error body, on the REST plane and envd's HTTP routes.
type apiError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

// statusOf is the HTTP status E2B answers for err's class; E2B's SDKs turn
// 401 into AuthenticationError, 404 into NotFoundError, 429 into
// RateLimitError, 400 into InvalidArgumentError and so on.
func statusOf(err error) int {
	switch errdefs.Class(err) {
	case errdefs.ErrInvalidArgument:
		return http.StatusBadRequest
	case errdefs.ErrNotFound:
		return http.StatusNotFound
	case errdefs.ErrAlreadyExists, errdefs.ErrFailedPrecondition:
		return http.StatusConflict
	case errdefs.ErrUnauthenticated:
		return http.StatusUnauthorized
	case errdefs.ErrPermissionDenied:
		return http.StatusForbidden
	case errdefs.ErrResourceExhausted:
		return http.StatusTooManyRequests
	case errdefs.ErrUnavailable:
		return http.StatusServiceUnavailable
	case errdefs.ErrDeadlineExceeded:
		return http.StatusGatewayTimeout
	case errdefs.ErrNotImplemented:
		return http.StatusNotImplemented
	}
	return http.StatusInternalServerError
}

func writeError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(apiError{Code: status, Message: msg})
}

// fail answers err with its class's status.
func fail(w http.ResponseWriter, err error) {
	writeError(w, statusOf(err), err.Error())
}

// notServed is the error of what the endpoint refuses, naming forkbox.
func notServed(what string) error {
	return fmt.Errorf("forkbox's E2B endpoint does not serve %s: %w", what, errdefs.ErrNotImplemented)
}

// toConnect converts an error leaving an envd RPC to its Connect code; an
// error that is already a Connect error keeps its code.
func toConnect(err error) error {
	return errconnect.ToConnect(err)
}

// isClass reports whether err has class c.
func isClass(err, c error) bool { return errors.Is(err, c) }
