package daemon

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/snapshot/btrfs"
	"github.com/forkbox/forkbox/internal/store"
)

// fillDir writes into dir until the filesystem says ENOSPC or EDQUOT: data
// first, then small files (metadata).
func fillDir(t *testing.T, dir string) {
	t.Helper()
	f, err := os.Create(filepath.Join(dir, "big"))
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1<<20)
	for {
		if _, err = f.Write(buf); err != nil {
			break
		}
	}
	f.Close()
	for i := 0; err == nil || !(errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT)); i++ {
		if err != nil && !(errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT)) {
			t.Fatalf("fill: got %v, want ENOSPC", err)
		}
		err = os.WriteFile(filepath.Join(dir, fmt.Sprintf("s%06d", i)), []byte("x"), 0o644)
	}
}

// TestFullPool: when the snapshot pool is full (a small btrfs here, its
// ledger on another filesystem), create, checkpoint and fork fail with
// ResourceExhausted, leave no snapshot behind, the source keeps running and
// the ledger records it all; once space is freed creates work again.
func TestFullPool(t *testing.T) {
	ctx := context.Background()
	if os.Geteuid() != 0 || btrfs.Supported(ctx) != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("needs root and btrfs")
		}
		t.Skip("needs root and btrfs")
	}
	pool := filepath.Join(t.TempDir(), "pool")
	t.Cleanup(func() {
		// The kernel releases the loop device asynchronously after the
		// unmount; Detach waits for that as a condition, bounded here by a
		// deadline generous enough for a loaded host.
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		if err := btrfs.Detach(ctx, pool); err != nil {
			t.Errorf("detach the pool: %v", err)
		}
	})
	h := newHarness(t)
	if err := h.d.Close(); err != nil {
		t.Fatal(err)
	}
	h.d = nil
	h.cfg.Snapshotter = "btrfs"
	snaps, err := btrfs.Open(ctx, pool, btrfs.Options{LoopSize: 256 << 20, Preallocate: true, Log: h.cfg.Log})
	if err != nil {
		t.Fatal(err)
	}
	if h.d, err = open(ctx, h.cfg, parts{snaps: snaps, net: fakeNet{h.w}, runtimes: h.runtimes(RuntimeGVisor, RuntimeCrun), host: h.w}); err != nil {
		t.Fatal(err)
	}

	src := h.create(CreateOptions{Name: "src"})
	fillDir(t, h.upper(src)) // a tenant without a limit fills the pool
	before, err := h.d.snaps.List(ctx)
	if err != nil {
		t.Fatal(err)
	}

	_, err = h.d.Create(ctx, CreateOptions{Image: "unit:1", Name: "late"})
	if !errdefs.IsResourceExhausted(err) {
		t.Errorf("create on a full pool: got %v, want ResourceExhausted", err)
	}
	if late, gerr := h.d.Get(ctx, "late"); gerr == nil {
		if late.State != store.StateClosed {
			t.Errorf("failed create: state %s, want closed", late.State)
		}
		if evs := h.events(late.ID); !slices.Contains(evs, store.EventSandboxFailed) {
			t.Errorf("failed create's ledger: %v, want %s (the ledger keeps working)", evs, store.EventSandboxFailed)
		}
	}
	if _, err := h.d.Checkpoint(ctx, src, "full"); !errdefs.IsResourceExhausted(err) {
		t.Errorf("checkpoint on a full pool: got %v, want ResourceExhausted", err)
	}
	if _, err := h.d.Fork(ctx, ForkOptions{Source: src, Count: 1}); !errdefs.IsResourceExhausted(err) {
		t.Errorf("fork on a full pool: got %v, want ResourceExhausted", err)
	}
	after, err := h.d.snaps.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(after) != len(before) {
		t.Errorf("snapshots after failed create/checkpoint/fork: got %d, want %d (nothing half-made)", len(after), len(before))
	}
	if sb, err := h.d.Get(ctx, src); err != nil || sb.State != store.StateRunning {
		t.Errorf("source after the failures: %v, %v, want running", sb, err)
	}
	if h.w.frozen[h.d.cgroupPath(src)] {
		t.Errorf("source left frozen")
	}

	// Freed space makes the pool usable again.
	for _, e := range mustReadDir(t, h.upper(src)) {
		os.Remove(filepath.Join(h.upper(src), e))
	}
	// btrfs frees the removed files' extents in the background (at its
	// next commit); the snapshotter waits for that when it meets a full
	// pool, so the first create after the removal succeeds.
	if _, err := h.d.Create(ctx, CreateOptions{Image: "unit:1"}); err != nil {
		out, _ := exec.Command("btrfs", "filesystem", "usage", pool).CombinedOutput()
		ls, _ := exec.Command("ls", "-la", h.upper(src)).CombinedOutput()
		t.Errorf("create right after freeing the pool: %v\n%s\n%s", err, out, ls)
	}
}

func mustReadDir(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}
