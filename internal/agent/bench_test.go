package agent

import (
	"context"
	"testing"
)

// BenchmarkExecRoundTrip measures one exec of /bin/true over loopback:
// dial, header, fork+exec, wait, result.
func BenchmarkExecRoundTrip(b *testing.B) {
	c := startServer(b, Config{MemoryLimit: 1 << 30})
	ctx := context.Background()
	req := ExecRequest{Argv: []string{"/bin/true"}}
	for b.Loop() {
		res, err := c.Exec(ctx, req, nil, nil)
		if err != nil || res.ExitCode != 0 {
			b.Fatalf("got %+v, %v", res, err)
		}
	}
}

// BenchmarkPing measures the bare request round trip.
func BenchmarkPing(b *testing.B) {
	c := startServer(b, Config{})
	ctx := context.Background()
	for b.Loop() {
		if _, err := c.Ping(ctx); err != nil {
			b.Fatal(err)
		}
	}
}
