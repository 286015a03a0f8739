package store

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/forkbox/forkbox/errdefs"
)

// SwapSandboxState changes a state only from the one the caller read.
func TestSwapSandboxStateIsCompareAndSet(t *testing.T) {
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "forkbox.db"))
	sb := &Sandbox{ID: "sb-1", Name: "one", State: StateCreating, Image: "img", Runtime: "gvisor", Config: SandboxConfig{Egress: "none"}}
	if err := s.CreateSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	if err := s.SwapSandboxState(ctx, "sb-1", StateCreating, StateRunning, ""); err != nil {
		t.Fatalf("creating -> running: %v", err)
	}
	// A second writer that read "creating" loses: the state is running now.
	err := s.SwapSandboxState(ctx, "sb-1", StateCreating, StateFailed, "boom")
	if !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("stale swap: got %v, want FailedPrecondition", err)
	}
	for _, want := range []string{"running", "creating", "failed"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("stale swap error %q does not name %q", err, want)
		}
	}
	got, err := s.GetSandbox(ctx, "sb-1")
	if err != nil || got.State != StateRunning || got.Error != "" {
		t.Fatalf("after a stale swap: %+v, %v; want running, no error", got, err)
	}
	if err := s.SwapSandboxState(ctx, "sb-1", StateRunning, StateDegraded, "agent slow"); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.GetSandbox(ctx, "sb-1"); got.State != StateDegraded || got.Error != "agent slow" {
		t.Fatalf("got %q %q, want degraded with its reason", got.State, got.Error)
	}
	if err := s.SwapSandboxState(ctx, "sb-nope", StateRunning, StateClosed, ""); !errdefs.IsNotFound(err) {
		t.Fatalf("unknown sandbox: got %v, want NotFound", err)
	}
}
