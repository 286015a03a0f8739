package daemon

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/store"
)

var allStates = []store.State{
	store.StateCreating, store.StateRunning, store.StatePaused, store.StateHibernating, store.StateHibernated,
	store.StateDegraded, store.StateFailed, store.StateClosing, store.StateClosed,
}

// TestTransitions checks every (from, to) pair: the allowed ones pass, every
// other one is a FailedPrecondition naming both states.
func TestTransitions(t *testing.T) {
	allowed := map[[2]store.State]bool{}
	for _, p := range [][2]store.State{
		{store.StateCreating, store.StateRunning}, {store.StateCreating, store.StateFailed}, {store.StateCreating, store.StateClosing},
		{store.StateRunning, store.StatePaused}, {store.StateRunning, store.StateHibernating}, {store.StateRunning, store.StateDegraded},
		{store.StateRunning, store.StateFailed}, {store.StateRunning, store.StateClosing},
		{store.StatePaused, store.StateRunning}, {store.StatePaused, store.StateHibernating}, {store.StatePaused, store.StateDegraded},
		{store.StatePaused, store.StateFailed}, {store.StatePaused, store.StateClosing},
		{store.StateHibernating, store.StateHibernated}, {store.StateHibernating, store.StateRunning}, {store.StateHibernating, store.StatePaused},
		{store.StateHibernating, store.StateFailed}, {store.StateHibernating, store.StateClosing},
		{store.StateHibernated, store.StateRunning}, {store.StateHibernated, store.StateFailed}, {store.StateHibernated, store.StateClosing},
		{store.StateDegraded, store.StateRunning}, {store.StateDegraded, store.StatePaused}, {store.StateDegraded, store.StateFailed},
		{store.StateDegraded, store.StateClosing},
		{store.StateFailed, store.StateClosing}, {store.StateFailed, store.StateClosed},
		{store.StateClosing, store.StateClosed}, {store.StateClosing, store.StateFailed},
	} {
		allowed[p] = true
	}
	for _, from := range allStates {
		if _, ok := transitions[from]; !ok {
			t.Errorf("state %s is missing from the transitions table", from)
		}
		for _, to := range allStates {
			err := checkTransition("sb-x", from, to)
			if allowed[[2]store.State{from, to}] {
				if err != nil {
					t.Errorf("%s -> %s: got %v, want allowed", from, to, err)
				}
				continue
			}
			if !errdefs.IsFailedPrecondition(err) {
				t.Errorf("%s -> %s: got %v, want FailedPrecondition", from, to, err)
				continue
			}
			if !strings.Contains(err.Error(), string(from)) || !strings.Contains(err.Error(), string(to)) {
				t.Errorf("%s -> %s: error %q does not name both states", from, to, err)
			}
		}
	}
	for from, tos := range transitions {
		for _, to := range tos {
			if !allowed[[2]store.State{from, to}] {
				t.Errorf("the table allows %s -> %s, which this test does not expect", from, to)
			}
		}
	}
}

func TestRequireState(t *testing.T) {
	sb := &store.Sandbox{ID: "sb-x", State: store.StateHibernated}
	if err := requireState(sb, "wake", store.StateHibernated); err != nil {
		t.Fatalf("got %v, want nil", err)
	}
	err := requireState(sb, "fork", store.StateRunning, store.StatePaused)
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "fork") || !strings.Contains(err.Error(), "hibernated") {
		t.Fatalf("got %v, want a FailedPrecondition naming the action and the state", err)
	}
}

// The store's state write has one caller, setState: every state change goes
// through the transition table.
func TestOnlySetStateWritesState(t *testing.T) {
	err := filepath.WalkDir("..", func(path string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		if filepath.Dir(path) == filepath.Join("..", "store") || path == filepath.Join("..", "daemon", "lifecycle.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if strings.Contains(string(b), ".SwapSandboxState(") {
			t.Errorf("%s writes a sandbox state directly; use setState", path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
