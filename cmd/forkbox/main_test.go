package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"testing"

	"connectrpc.com/connect"

	v1 "github.com/forkbox/forkbox/api/forkbox/v1"
	"github.com/forkbox/forkbox/api/forkbox/v1/forkboxv1connect"
	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/errdefs/errconnect"
)

// agentDown is a daemon whose sandbox agent does not answer: it returns
// Unavailable with a dial error of its own.
type agentDown struct {
	forkboxv1connect.UnimplementedSandboxServiceHandler
}

func (agentDown) ListSandboxes(context.Context, *connect.Request[v1.ListSandboxesRequest]) (*connect.Response[v1.ListSandboxesResponse], error) {
	err := fmt.Errorf("dial unix /var/lib/forkbox/sb-1/agent.sock: i/o timeout: %w", errdefs.ErrUnavailable)
	return nil, errconnect.ToConnect(err)
}

// serveUnix serves h on a unix socket and returns the socket's path.
func serveUnix(t *testing.T, h http.Handler) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "d.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return sock
}

// serveTCP serves h on a loopback port and returns its URL.
func serveTCP(t *testing.T, h http.Handler) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return "http://" + ln.Addr().String()
}

func TestDaemonUnreachableHint(t *testing.T) {
	mux := http.NewServeMux()
	mux.Handle(forkboxv1connect.NewSandboxServiceHandler(agentDown{}))
	sock := serveUnix(t, mux)
	url := serveTCP(t, mux)
	// A TCP address nothing listens on: a listener opened and closed.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadURL := "http://" + ln.Addr().String()
	ln.Close()

	for _, c := range []struct {
		name, host string
		want       bool
	}{
		{"no socket", "unix://" + filepath.Join(t.TempDir(), "none.sock"), true},
		{"refused tcp", deadURL, true},
		{"agent dial error from the daemon, unix", "unix://" + sock, false},
		{"agent dial error from the daemon, tcp", url, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			g := &globals{host: c.host}
			_, err := g.client().ListSandboxes(context.Background(), false)
			if err == nil {
				t.Fatal("ListSandboxes succeeded; want an error")
			}
			if !errdefs.IsUnavailable(err) {
				t.Fatalf("got %v (%s), want Unavailable", err, errdefs.ClassName(err))
			}
			if got := daemonUnreachable(err, c.host); got != c.want {
				t.Errorf("daemonUnreachable(%q) = %v, want %v", err, got, c.want)
			}
		})
	}
	// Errors of other classes never get the hint.
	if daemonUnreachable(errors.New("dial unix "+client.DefaultSocket+": connect: no such file or directory"), "") {
		t.Error("an error without the Unavailable class got the hint")
	}
	// The default socket, and a host name that does not resolve.
	for _, c := range []struct{ msg, host string }{
		{"dial unix " + client.DefaultSocket + ": connect: no such file or directory", ""},
		{"dial tcp: lookup nosuch.invalid: no such host", "http://nosuch.invalid:7070"},
		{"dial tcp [::1]:7070: connect: connection refused", "http://localhost:7070"},
	} {
		if !daemonUnreachable(fmt.Errorf("%s: %w", c.msg, errdefs.ErrUnavailable), c.host) {
			t.Errorf("%q with --host %q: no hint", c.msg, c.host)
		}
	}
	// The daemon's own agent dial, on another port, is not the daemon.
	if daemonUnreachable(fmt.Errorf("dial tcp 10.88.0.5:2024: i/o timeout: %w", errdefs.ErrUnavailable), "http://127.0.0.1:7070") {
		t.Error("an agent dial error returned by the daemon got the hint")
	}
}
