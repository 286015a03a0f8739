package daemon

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/store"
)

// TestPortTarget: a running sandbox's port is its own address; the
// sandbox is busy until done; a hibernated one is woken; paused, closed,
// unknown, a name instead of the ID, and bad ports are refused by class.
func TestPortTarget(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	id := h.create(CreateOptions{Name: "web"})
	addr, done, err := h.d.PortTarget(ctx, id, 8080)
	if err != nil || addr != h.state(id).IP+":8080" {
		t.Fatalf("got %q %v, want the sandbox's address %s:8080", addr, err, h.state(id).IP)
	}
	later := time.Now().Add(time.Hour)
	if idle := h.d.idleFor(id, later); idle != 0 {
		t.Errorf("idle %s during a proxied request, want busy", idle)
	}
	done()
	if idle := h.d.idleFor(id, later); idle < 59*time.Minute {
		t.Errorf("idle %s an hour after the request ended", idle)
	}
	for _, tc := range []struct {
		id    string
		port  int
		class func(error) bool
	}{
		{"web", 8080, errdefs.IsNotFound}, // a name: the token is the ID's
		{"sb-000000000000", 8080, errdefs.IsNotFound},
		{id, 7077, errdefs.IsPermissionDenied},
		{id, 0, errdefs.IsInvalidArgument},
		{id, 70000, errdefs.IsInvalidArgument},
	} {
		if _, _, err := h.d.PortTarget(ctx, tc.id, tc.port); !tc.class(err) {
			t.Errorf("PortTarget(%s, %d): got %v, want %s", tc.id, tc.port, err, "its class")
		}
	}
	if _, err := h.d.Hibernate(ctx, id); err != nil {
		t.Fatal(err)
	}
	_, done, err = h.d.PortTarget(ctx, id, 8080)
	if err != nil || h.state(id).State != store.StateRunning {
		t.Fatalf("hibernated: got %v, state %s; want woken", err, h.state(id).State)
	}
	done()
	if _, err := h.d.Pause(ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, _, err := h.d.PortTarget(ctx, id, 8080); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "paused") {
		t.Errorf("paused: got %v, want FailedPrecondition saying paused", err)
	}
	if _, err := h.d.Unpause(ctx, id); err != nil {
		t.Fatal(err)
	}
	if err := h.d.Delete(ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, _, err := h.d.PortTarget(ctx, id, 8080); !errdefs.IsNotFound(err) {
		t.Errorf("closed: got %v, want NotFound", err)
	}
	if _, err := h.d.PortURL(ctx, id, 8080); !errdefs.IsNotFound(err) {
		t.Errorf("PortURL of a closed sandbox: got %v, want NotFound", err)
	}
}

// TestPortURL: without a listener GetPortURL says how to start one; with
// one, the token is per sandbox and survives a restart.
func TestPortURL(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	a, b := h.create(CreateOptions{}), h.create(CreateOptions{})
	if _, err := h.d.PortURL(ctx, a, 8080); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "--ports") {
		t.Errorf("no listener: got %v, want FailedPrecondition naming --ports", err)
	}
	h.cfg.PortsAddr = "127.0.0.1:0"
	h.reopen(h.runtimes(RuntimeGVisor, RuntimeCrun))
	ua, err := h.d.PortURL(ctx, a, 8080)
	if err != nil {
		t.Fatal(err)
	}
	ub, _ := h.d.PortURL(ctx, b, 8080)
	if ua.Token == ub.Token || !strings.HasPrefix(ua.URL, "http://8080-"+a+".localhost:") || !strings.HasSuffix(ua.URL, "?forkbox_token="+ua.Token) {
		t.Errorf("URLs %+v and %+v: want per-sandbox tokens in the host form", ua, ub)
	}
	if _, err := h.d.PortURL(ctx, a, 7077); !errdefs.IsPermissionDenied(err) {
		t.Errorf("the agent's port: got %v", err)
	}
	h.reopen(h.runtimes(RuntimeGVisor, RuntimeCrun))
	again, err := h.d.PortURL(ctx, a, 8080)
	if err != nil || again.Token != ua.Token {
		t.Errorf("after a restart: token %q (%v), want %q", again.Token, err, ua.Token)
	}
}
