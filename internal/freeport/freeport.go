// Package freeport picks loopback TCP addresses for tests (and the bench)
// to hand to a process that listens on them later.
//
// The usual way, listening on port 0 and closing, gives a port from the
// kernel's ephemeral range (net.ipv4.ip_local_port_range): until the
// process binds it, any outgoing connection on the host may take it as its
// source port, and the process then fails with "address already in use"
// (the e2e dashboard test did, beside the cluster suite's connections).
// Ports below that range are never given out as source ports.
package freeport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
)

var (
	mu    sync.Mutex
	given = map[int]bool{} // handed out by this process: not again
)

// Loopback returns 127.0.0.1:<port> with a port below the ephemeral range
// that nothing listens on now and this process has not handed out before.
func Loopback() (string, error) {
	low := ephemeralLow()
	first := max(1024, low-16384)
	mu.Lock()
	defer mu.Unlock()
	for range 500 {
		p := first + rand.IntN(low-first)
		if given[p] {
			continue
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			continue // in use
		}
		l.Close()
		given[p] = true
		return l.Addr().String(), nil
	}
	return "", fmt.Errorf("freeport: no free loopback port in %d-%d", first, low-1)
}

// ephemeralLow is the first port of the kernel's ephemeral range (32768
// when it cannot be read).
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	f := strings.Fields(string(b))
	if len(f) < 1 {
		return 32768
	}
	n, err := strconv.Atoi(f[0])
	if err != nil || n <= 2048 {
		return 32768
	}
	return n
}
