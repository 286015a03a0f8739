package server

import (
	"fmt"
	"time"

	"github.com/forkbox/forkbox/errdefs"
)

// maxTimeoutMs is the longest timeout, in ms, that a time.Duration holds.
const maxTimeoutMs = int64(1<<63-1) / int64(time.Millisecond)

// execTimeout converts a caller's timeout_ms. One that does not fit a
// time.Duration is refused: multiplied blindly it wraps, to a negative
// timeout or to a short one the caller never asked for.
func execTimeout(ms int64) (time.Duration, error) {
	if ms > maxTimeoutMs {
		return 0, fmt.Errorf("timeout_ms %d: more than %d: %w", ms, maxTimeoutMs, errdefs.ErrInvalidArgument)
	}
	return time.Duration(ms) * time.Millisecond, nil
}

// lifetimeTimeout converts a sandbox's timeout_ms. One that does not fit a
// time.Duration becomes the longest there is, which the daemon refuses as
// too long (InvalidArgument) instead of wrapping.
func lifetimeTimeout(ms int64) time.Duration {
	if ms > maxTimeoutMs {
		return time.Duration(1<<63 - 1)
	}
	if ms < -maxTimeoutMs {
		return -1
	}
	return time.Duration(ms) * time.Millisecond
}
