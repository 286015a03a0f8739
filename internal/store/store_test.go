package store

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/forkbox/forkbox/errdefs"
)

func open(t *testing.T, path string) *Store {
	t.Helper()
	s, err := Open(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestSandboxesAndLedger(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "forkbox.db")
	s := open(t, path)
	sb := &Sandbox{ID: "sb-1", Name: "one", State: StateCreating, Image: "img", Runtime: "gvisor",
		Config: SandboxConfig{Egress: "none", Env: map[string]string{"A": "b"}}, IP: "10.88.0.2"}
	if err := s.CreateSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	dup := *sb
	dup.ID = "sb-2"
	if err := s.CreateSandbox(ctx, &dup); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("duplicate name: got %v, want AlreadyExists", err)
	}
	if _, err := s.AppendEvent(ctx, "sb-1", EventSandboxCreated, map[string]any{"image": "img"}); err != nil {
		t.Fatal(err)
	}
	if err := s.SwapSandboxState(ctx, "sb-1", StateCreating, StateClosed, ""); err != nil {
		t.Fatal(err)
	}
	// A closed sandbox frees its name.
	if err := s.CreateSandbox(ctx, &dup); err != nil {
		t.Fatalf("reuse of a closed sandbox's name: %v", err)
	}
	got, err := s.GetSandbox(ctx, "one")
	if err != nil || got.ID != "sb-2" {
		t.Fatalf("GetSandbox(name) = %v, %v; want the live sb-2", got, err)
	}
	if _, err := s.GetSandbox(ctx, "nope"); !errdefs.IsNotFound(err) {
		t.Fatalf("got %v, want NotFound", err)
	}
	s.Close()

	// Reopen: migrations are idempotent, data survives.
	s2 := open(t, path)
	got, err = s2.GetSandbox(ctx, "sb-1")
	if err != nil || got.State != StateClosed || got.Config.Env["A"] != "b" {
		t.Fatalf("after reopen got %+v, %v", got, err)
	}
	evs, err := s2.Events(ctx, "sb-1")
	if err != nil || len(evs) != 1 || evs[0].Type != EventSandboxCreated || evs[0].Data["image"] != "img" {
		t.Fatalf("events after reopen: %+v, %v", evs, err)
	}
	if used, err := s2.IPInUse(ctx, "10.88.0.2"); err != nil || !used {
		t.Fatalf("the live sb-2's address: in use %v, %v; want true", used, err)
	}
	if used, err := s2.IPInUse(ctx, "10.88.0.3"); err != nil || used {
		t.Fatalf("an address no sandbox holds: in use %v, %v; want false", used, err)
	}
}
