package freeport

import (
	"net"
	"strconv"
	"testing"
)

// Addresses are loopback, below the ephemeral range, free to listen on,
// and never handed out twice by one process.
func TestLoopback(t *testing.T) {
	low := ephemeralLow()
	seen := map[string]bool{}
	for range 200 {
		a, err := Loopback()
		if err != nil {
			t.Fatal(err)
		}
		host, port, _ := net.SplitHostPort(a)
		p, _ := strconv.Atoi(port)
		if host != "127.0.0.1" || p < 1024 || p >= low || seen[a] {
			t.Fatalf("Loopback() = %s; want 127.0.0.1, a port in 1024..%d, not seen before", a, low-1)
		}
		seen[a] = true
		l, err := net.Listen("tcp", a)
		if err != nil {
			t.Fatalf("listen on %s: %v", a, err)
		}
		l.Close()
	}
}
