package agent

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// tcpTimer is the kernel's word on a TCP socket (/proc/net/tcp): its timer
// kind (0 none, 1 retransmit, 2 keepalive and others) and when it fires.
type tcpTimer struct {
	kind int
	when time.Duration
}

// tcpTimers reads /proc/net/tcp: the timers of the established IPv4
// sockets, by "local->remote" port.
func tcpTimers(t *testing.T) map[string]tcpTimer {
	t.Helper()
	f, err := os.Open("/proc/net/tcp")
	if err != nil {
		t.Skipf("needs /proc/net/tcp: %v", err)
	}
	defer f.Close()
	out := map[string]tcpTimer{}
	sc := bufio.NewScanner(f)
	sc.Scan() // header
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) < 6 || fs[3] != "01" { // ESTABLISHED
			continue
		}
		port := func(a string) int64 {
			p, _ := strconv.ParseInt(a[strings.IndexByte(a, ':')+1:], 16, 32)
			return p
		}
		kind, when, _ := strings.Cut(fs[5], ":")
		k, _ := strconv.ParseInt(kind, 16, 32)
		w, _ := strconv.ParseInt(when, 16, 64) // in USER_HZ (100) ticks
		out[fmt.Sprintf("%d->%d", port(fs[1]), port(fs[2]))] = tcpTimer{int(k), time.Duration(w) * 10 * time.Millisecond}
	}
	return out
}

// TestKeepAliveSlowAndOneSided: a connection between the daemon's client
// and the agent has no keepalive timer on the agent's side and a slow one
// (dialKeepAlive, minutes) on the daemon's, by the kernel's /proc/net/tcp:
// Go's default of a probe every 15 s from both ends woke every idle gVisor
// sandbox about eight times a minute.
func TestKeepAliveSlowAndOneSided(t *testing.T) {
	s, err := NewServer(Config{Token: testToken, LogDir: t.TempDir(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ln, err := listen(ctx, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); s.Serve(ctx, ln) }()
	c := newTestClient(ln.Addr().String(), testToken)
	t.Cleanup(func() { c.Close(); cancel(); <-done })
	if _, err := c.Ping(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	agentPort := ln.Addr().(*net.TCPAddr).Port

	// The session stays open; wait until neither end has data in flight
	// (a retransmit timer) and read both ends' timers.
	deadline := time.Now().Add(time.Minute)
	for {
		var agentSide, daemonSide *tcpTimer
		for k, v := range tcpTimers(t) {
			local, remote, _ := strings.Cut(k, "->")
			if local == strconv.Itoa(agentPort) {
				agentSide = &v
			} else if remote == strconv.Itoa(agentPort) {
				daemonSide = &v
			}
		}
		if agentSide == nil || daemonSide == nil {
			t.Fatalf("the session's sockets are not in /proc/net/tcp (agent %v, daemon %v)", agentSide, daemonSide)
		}
		if agentSide.kind != 1 && daemonSide.kind != 1 {
			if agentSide.kind != 0 {
				t.Errorf("agent's side: timer %d firing in %s; want none (no keepalive)", agentSide.kind, agentSide.when)
			}
			if daemonSide.kind != 2 || daemonSide.when < time.Minute {
				t.Errorf("daemon's side: timer %d firing in %s; want a keepalive in about %s", daemonSide.kind, daemonSide.when, dialKeepAlive.Idle)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("data still in flight on an idle session after a minute")
		}
		time.Sleep(10 * time.Millisecond) // polling the kernel's table: it has no event
	}
}

// The daemon's connections to an agent carry a TCP user timeout: a request
// sent to a sandbox whose runtime died (it acknowledges nothing, and
// resets nothing) ends the connection after dialUserTimeout instead of
// waiting for ever (e2e TestDeadSandboxFailsExec drives the real case).
func TestDialSetsUserTimeout(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c := newTestClient(ln.Addr().String(), testToken)
	conn, err := c.dial(testCtx(t), "test")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	raw, err := conn.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var got int
	var gerr error
	raw.Control(func(fd uintptr) { got, gerr = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT) })
	if gerr != nil || got != int(dialUserTimeout.Milliseconds()) {
		t.Errorf("TCP_USER_TIMEOUT = %d ms (%v), want %d", got, gerr, dialUserTimeout.Milliseconds())
	}
}
