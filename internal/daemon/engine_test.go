package daemon

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/forkbox/forkbox/internal/store"
)

// A sandbox is created, forked and restored on the fake host: the children
// start from the parent's writable layer, each with its own identity, and
// closing leaves nothing of them.
func TestCreateForkRestore(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	src := h.create(CreateOptions{Name: "src", Env: map[string]string{"A": "1"}, Cwd: "/root"})
	// What the sandbox writes lands in its upper dir (the fake mounts
	// nothing): written there directly.
	if err := os.MkdirAll(filepath.Join(h.upper(src), "root"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(h.upper(src), "root", "state"), []byte("before"), 0o644); err != nil {
		t.Fatal(err)
	}
	res, err := h.d.Fork(ctx, ForkOptions{Source: "src", Count: 2, Tag: "t1", Overrides: Overrides{Env: map[string]string{"B": "2"}}})
	if err != nil {
		t.Fatal(err)
	}
	if res.Captured != KindFilesystem || len(res.Children) != 2 {
		t.Fatalf("fork: captured %q, %d children; want filesystem, 2", res.Captured, len(res.Children))
	}
	ips := map[string]bool{}
	for i, c := range res.Children {
		if c.Err != nil {
			t.Fatalf("child %d: %v", i, c.Err)
		}
		sb := c.Sandbox
		if sb.State != store.StateRunning || sb.ParentID != src || sb.FromCheckpoint != res.Checkpoint.ID {
			t.Errorf("child %d: state %s parent %s from %s; want running, %s, %s", i, sb.State, sb.ParentID, sb.FromCheckpoint, src, res.Checkpoint.ID)
		}
		if sb.Config.Env["A"] != "1" || sb.Config.Env["B"] != "2" || sb.Config.Cwd != "/root" {
			t.Errorf("child %d config: env %v cwd %q; want A=1 inherited, B=2 added, cwd /root", i, sb.Config.Env, sb.Config.Cwd)
		}
		if b, err := os.ReadFile(filepath.Join(h.upper(sb.ID), "root", "state")); err != nil || string(b) != "before" {
			t.Errorf("child %d: root/state = %q, %v; want the parent's", i, b, err)
		}
		ips[sb.IP] = true
		if h.w.status(sb.ID) != "running" {
			t.Errorf("child %d: container %q, want running", i, h.w.status(sb.ID))
		}
	}
	if len(ips) != 2 {
		t.Errorf("children share an address: %v", ips)
	}
	if evs := h.events(src); !slices.Contains(evs, store.EventCheckpointCreated) || !slices.Contains(evs, store.EventForked) {
		t.Errorf("source ledger %v: want checkpoint_created and forked", evs)
	}

	r, err := h.d.RestoreSnapshot(ctx, res.Checkpoint.ID, Overrides{Name: "again"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if r.Name != "again" || r.State != store.StateRunning || r.Config.Env["B"] != "" {
		t.Errorf("restore: name %q state %s env %v; want again, running, the checkpoint's env", r.Name, r.State, r.Config.Env)
	}

	for _, id := range []string{res.Children[0].Sandbox.ID, res.Children[1].Sandbox.ID, r.ID, src} {
		if err := h.d.Delete(ctx, id); err != nil {
			t.Fatalf("close %s: %v", id, err)
		}
		if sb, _ := h.d.Get(ctx, id); sb.State != store.StateClosed {
			t.Errorf("%s: state %s after close, want closed", id, sb.State)
		}
		if h.w.status(id) != "" {
			t.Errorf("%s: container left after close", id)
		}
		if _, err := os.Stat(h.d.bundleDir(id)); !os.IsNotExist(err) {
			t.Errorf("%s: bundle left after close (%v)", id, err)
		}
	}
	h.w.mu.Lock()
	defer h.w.mu.Unlock()
	if len(h.w.mounts) != 0 || len(h.w.netns) != 0 {
		t.Errorf("left after closing all: mounts %v netns %v", h.w.mounts, h.w.netns)
	}
}
