package main

import (
	"context"
	"net"
	"strings"
	"testing"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/mcpserver"
)

// TestMCPHTTPNeedsToken: `mcp --http` without a token is refused before it
// listens, on loopback too (any user of the host can reach it), and the port
// stays free.
func TestMCPHTTPNeedsToken(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	// Cancelled, so that a server that does start returns at once.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for _, a := range []string{addr, "[::1]:0", "0.0.0.0:0"} {
		err := serveMCPHTTP(ctx, mcpserver.New(nil), a, "")
		if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "--api-token") {
			t.Errorf("--http %s without a token: got %v, want InvalidArgument naming --api-token", a, err)
		}
	}
	ln, err = net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("the refused address is not free: %v", err)
	}
	ln.Close()
}
