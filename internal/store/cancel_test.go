package store

import (
	"context"
	"path/filepath"
	"testing"
)

// TestWriteOutlivesCancel: a write is made whatever becomes of its caller's
// context, and says so. Before, modernc's driver answered a statement during
// which the context ended with the context's error even when it had
// completed: e2e TestPtySessionBounds saw an exec.started, written while its
// caller went away, whose exec then never ran and never got its
// exec.finished. An already cancelled context is the deterministic case of
// it; the race below is the one the e2e test hit.
func TestWriteOutlivesCancel(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "forkbox.db"))
	bg := context.Background()
	if err := s.CreateSandbox(bg, &Sandbox{ID: "sb-1", Name: "one", State: StateRunning, Runtime: "gvisor", Pool: "env"}); err != nil {
		t.Fatal(err)
	}
	gone, cancel := context.WithCancel(bg)
	cancel()
	if _, err := s.AppendEvent(gone, "sb-1", EventExecStarted, map[string]any{"exec_id": "ex-0"}); err != nil {
		t.Fatalf("append with a cancelled context: %v", err)
	}
	if sb, err := s.TakeFromPool(gone, "env", ""); err != nil || sb == nil || sb.ID != "sb-1" {
		t.Fatalf("take from pool with a cancelled context: %v, %v", sb, err)
	}

	// Cancelled while the write runs: it must be in the ledger exactly
	// when it reported success.
	const n = 300
	for i := 1; i <= n; i++ {
		ctx, cancel := context.WithCancel(bg)
		go cancel()
		_, err := s.AppendEvent(ctx, "sb-1", EventExecStarted, map[string]any{"exec_id": i})
		if err != nil {
			t.Fatalf("append %d: %v", i, err)
		}
	}
	evs, err := s.Events(bg, "sb-1")
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != n+1 {
		t.Fatalf("%d events in the ledger, want %d", len(evs), n+1)
	}
}
