package daemon

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/store"
)

// Every start checks the caller's options by the same rules: create, fork,
// restore and a start from a checkpoint (an environment's hand-over) refuse
// the same bad input with the same class, and make nothing.
func TestStartValidation(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	// The source's env is near the cap: an override that adds a little
	// must be refused, as create refuses the same env.
	big := map[string]string{"BIG": strings.Repeat("x", maxEnvBytes-100)}
	src := h.create(CreateOptions{Name: "src", Env: big})
	ck, err := h.d.Checkpoint(ctx, src, "base")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		o    Overrides
		want func(error) bool
	}{
		{"relative cwd", Overrides{Cwd: "root/work"}, errdefs.IsInvalidArgument},
		{"NUL in cwd", Overrides{Cwd: "/a\x00b"}, errdefs.IsInvalidArgument},
		{"NUL in an env value", Overrides{Env: map[string]string{"A": "x\x00y"}}, errdefs.IsInvalidArgument},
		{"env over the cap with what is inherited", Overrides{Env: map[string]string{"MORE": strings.Repeat("y", 200)}}, errdefs.IsResourceExhausted},
		{"bad env name", Overrides{Env: map[string]string{"1X": "v"}}, errdefs.IsInvalidArgument},
		{"env name with =", Overrides{Env: map[string]string{"A=B": "v"}}, errdefs.IsInvalidArgument},
		{"name starting with -", Overrides{Name: "-bad"}, errdefs.IsInvalidArgument},
		{"name with a slash", Overrides{Name: "a/../b"}, errdefs.IsInvalidArgument},
		{"name too long", Overrides{Name: strings.Repeat("a", 64)}, errdefs.IsInvalidArgument},
		{"bad cpu", Overrides{CPU: "lots"}, errdefs.IsInvalidArgument},
		{"too little memory", Overrides{Memory: "1Ki"}, errdefs.IsInvalidArgument},
		{"too few pids", Overrides{Pids: 3}, errdefs.IsInvalidArgument},
		{"bad egress", Overrides{Egress: "some"}, errdefs.IsInvalidArgument},
		{"negative timeout", Overrides{Timeout: -time.Second}, errdefs.IsInvalidArgument},
		{"timeout over the bound", Overrides{Timeout: maxTimeout + time.Second}, errdefs.IsInvalidArgument},
		{"bad on_timeout", Overrides{OnTimeout: "explode"}, errdefs.IsInvalidArgument},
		{"bad egress cidr", Overrides{EgressAllow: []string{"10.0.0.0/33"}}, errdefs.IsInvalidArgument},
		{"bad egress name", Overrides{EgressAllow: []string{"a..b"}}, errdefs.IsInvalidArgument},
		{"too many egress entries", Overrides{EgressDeny: strings.Split(strings.Repeat("10.0.0.0/8,", 65), ",")[:65], Egress: "all"}, errdefs.IsInvalidArgument},
		{"egress none with a list", Overrides{Egress: "none", EgressAllow: []string{"10.0.0.0/8"}}, errdefs.IsInvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			live := h.liveCount()
			cks, _ := h.d.store.ListCheckpoints(ctx, src)
			env := map[string]string{}
			for k, v := range big {
				env[k] = v
			}
			for k, v := range tc.o.Env {
				env[k] = v
			}
			calls := map[string]error{}
			_, calls["create"] = h.d.Create(ctx, CreateOptions{Image: "unit:1", Name: tc.o.Name, CPU: tc.o.CPU, Memory: tc.o.Memory,
				Pids: tc.o.Pids, Env: env, Cwd: tc.o.Cwd, Egress: tc.o.Egress, Timeout: tc.o.Timeout, OnTimeout: tc.o.OnTimeout,
				EgressAllow: tc.o.EgressAllow, EgressDeny: tc.o.EgressDeny})
			_, calls["fork"] = h.d.Fork(ctx, ForkOptions{Source: src, Overrides: tc.o})
			_, calls["fork from checkpoint"] = h.d.Fork(ctx, ForkOptions{Source: src, FromCheckpoint: ck.ID, Overrides: tc.o})
			_, calls["restore"] = h.d.RestoreSnapshot(ctx, ck.ID, tc.o, nil)
			_, calls["start from checkpoint"] = h.d.startFromCheckpoint(ctx, startOptions{checkpoint: ck, overrides: tc.o, defaultName: "env-x"})
			for call, err := range calls {
				if !tc.want(err) {
					t.Errorf("%s: got %v, want %s", call, err, errdefs.Class(err))
				}
			}
			if got := h.liveCount(); got != live {
				t.Errorf("%d live sandboxes after refused starts, want %d", got, live)
			}
			if after, _ := h.d.store.ListCheckpoints(ctx, src); len(after) != len(cks) {
				t.Errorf("a refused fork captured a checkpoint: %d, want %d", len(after), len(cks))
			}
		})
	}
}

// A fork's reserved slots are given back when a child's start is refused.
func TestRefusedChildGivesItsSlotBack(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	ck := h.checkpoint(h.create(CreateOptions{Name: "src"}))
	if _, err := h.d.reserveSlots(ctx, 1, false); err != nil {
		t.Fatal(err)
	}
	if _, err := h.d.startFromCheckpoint(ctx, startOptions{checkpoint: ck, overrides: Overrides{Cwd: "rel"}, slotReserved: true}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("got %v, want InvalidArgument", err)
	}
	if h.d.pendingSlots != 0 {
		t.Fatalf("pending slots %d after a refused start, want 0", h.d.pendingSlots)
	}
}

func TestWithOverrides(t *testing.T) {
	base := store.SandboxConfig{CPU: 1, MemoryBytes: 512 << 20, Pids: 100, Env: map[string]string{"A": "1"}, Cwd: "/w", Egress: "none"}
	got, err := withOverrides(base, Overrides{CPU: "500m", Memory: "1Gi", Pids: 64, Env: map[string]string{"B": "2"}, Cwd: "/x", Egress: "all"})
	if err != nil {
		t.Fatal(err)
	}
	if got.CPU != 0.5 || got.CPUString != "500m" || got.MemoryBytes != 1<<30 || got.Pids != 64 || got.Cwd != "/x" || got.Egress != "all" ||
		got.Env["A"] != "1" || got.Env["B"] != "2" {
		t.Errorf("got %+v", got)
	}
	if base.Env["B"] != "" {
		t.Errorf("the base's env was changed: %v", base.Env)
	}
	same, err := withOverrides(base, Overrides{})
	if err != nil || same.CPU != 1 || same.Cwd != "/w" || same.Egress != "none" || same.Env["A"] != "1" {
		t.Errorf("no overrides: got %+v, %v; want the base", same, err)
	}
}

// A checkpoint whose runtime this daemon does not have is refused before
// anything is made (it used to reach launch with a nil runtime).
func TestStartRefusesMissingRuntime(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	ck := h.checkpoint(h.create(CreateOptions{Name: "src"}))
	ck.Runtime = "kata"
	live := h.liveCount()
	if _, err := h.d.startFromCheckpoint(ctx, startOptions{checkpoint: ck}); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("got %v, want FailedPrecondition", err)
	}
	if h.liveCount() != live {
		t.Fatal("a refused start recorded a sandbox")
	}
}

// checkpoint takes a filesystem checkpoint of a sandbox or fails the test.
func (h *harness) checkpoint(id string) *store.Checkpoint {
	h.t.Helper()
	ck, err := h.d.Checkpoint(context.Background(), id, "")
	if err != nil {
		h.t.Fatal(err)
	}
	return ck
}
