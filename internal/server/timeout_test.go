package server

import (
	"testing"
	"time"
)

// A caller's timeout_ms never wraps into a short or negative duration:
// one too large for a time.Duration becomes the longest there is (which
// the daemon refuses as too long).
func TestLifetimeTimeout(t *testing.T) {
	for _, tc := range []struct {
		ms   int64
		want time.Duration
	}{
		{0, 0},
		{1500, 1500 * time.Millisecond},
		{-1, -time.Millisecond},
		{maxTimeoutMs, time.Duration(maxTimeoutMs) * time.Millisecond},
		{maxTimeoutMs + 1, time.Duration(1<<63 - 1)},
		{1<<63 - 1, time.Duration(1<<63 - 1)},
		{-1 << 63, -1},
	} {
		if got := lifetimeTimeout(tc.ms); got != tc.want {
			t.Errorf("lifetimeTimeout(%d) = %v, want %v", tc.ms, got, tc.want)
		}
	}
}
