package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/mount"
	"github.com/forkbox/forkbox/internal/runtime/testsuite"
	"github.com/forkbox/forkbox/internal/snapshot"
	"github.com/forkbox/forkbox/internal/snapshot/naive"
	"github.com/forkbox/forkbox/internal/store"
)

// stuckSnaps is a snapshotter whose Remove fails, as storage's does while
// a writable layer is still mounted.
type stuckSnaps struct{ snapshot.Snapshotter }

func (stuckSnaps) Remove(_ context.Context, key string) error {
	return fmt.Errorf("remove %q: still mounted at somewhere: %w", key, errdefs.ErrFailedPrecondition)
}

// A sandbox that reconcile cannot clean does not stop the daemon from
// starting: it is recorded failed with the reason and a ledger note, and a
// later close cleans it.
func TestReconcileCleanupFailureStillStarts(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	gone := h.create(CreateOptions{Name: "gone"})
	kept := h.create(CreateOptions{Name: "kept"})
	h.w.crash(gone)

	stuck := func(s snapshot.Snapshotter) snapshot.Snapshotter { return stuckSnaps{s} }
	snaps, err := h.openWith(h.runtimes(RuntimeGVisor, RuntimeCrun), stuck, nil)
	if err != nil {
		t.Fatalf("open with a sandbox that cannot be cleaned: got %v, want the daemon started", err)
	}

	sb := h.state(gone)
	if sb.State != store.StateFailed || !strings.Contains(sb.Error, "still mounted") {
		t.Errorf("uncleanable sandbox: state %s %q, want failed, with the reason", sb.State, sb.Error)
	}
	if evs := h.events(gone); !slices.Contains(evs, store.EventSandboxFailed) {
		t.Errorf("uncleanable sandbox ledger %v: want %s", evs, store.EventSandboxFailed)
	}
	if sb := h.state(kept); sb.State != store.StateRunning {
		t.Errorf("healthy sandbox: state %s, want running", sb.State)
	}

	// Once the leftover can go, a close cleans it.
	h.d.snaps = snaps
	if err := h.d.Delete(ctx, gone); err != nil {
		t.Fatalf("close of the failed sandbox: %v", err)
	}
	if sb := h.state(gone); sb.State != store.StateClosed {
		t.Errorf("after a close that can clean it: state %s %q, want closed", sb.State, sb.Error)
	}
	if err := h.d.Delete(ctx, kept); err != nil {
		t.Fatal(err)
	}
}

// A rootfs mounted twice (the overlay over its writable layer, stacked)
// is wholly unmounted by teardown's unmountRootfs, so that the writable
// layer can be removed.
func TestUnmountRootfsStacked(t *testing.T) {
	testsuite.Need(t, os.Geteuid() == 0, "mounting needs root")
	ctx := context.Background()
	dir := t.TempDir()
	snaps, err := naive.Open(ctx, filepath.Join(dir, "snapshots"), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	d := &Daemon{cfg: Config{StateDir: dir}, log: slog.New(slog.NewTextHandler(io.Discard, nil)), host: realHost{}, snaps: snaps}
	const id = "sb-stacked"
	if err := snaps.Prepare(ctx, id, ""); err != nil {
		t.Fatal(err)
	}
	lower := filepath.Join(dir, "lower")
	if err := os.MkdirAll(lower, 0o755); err != nil {
		t.Fatal(err)
	}
	ms, err := snaps.Mounts(ctx, id, []string{lower})
	if err != nil {
		t.Fatal(err)
	}
	rootfs := d.rootfsDir(id)
	if err := os.MkdirAll(rootfs, 0o700); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for i := 0; i < 4; i++ {
			_ = mount.Unmount(ctx, rootfs)
		}
	})
	// The overlay, then a bind of the upper directory over it: two mounts
	// on the rootfs, both holding the writable layer.
	bind := mount.Mount{Type: "bind", Source: filepath.Join(snapsDir(dir), "active", id, "upper"), Options: []string{"rbind"}}
	for _, m := range [][]mount.Mount{ms, {bind}} {
		if err := mount.All(ctx, m, rootfs); err != nil {
			t.Skipf("mount: %v", err)
		}
	}

	if err := d.unmountRootfs(ctx, id); err != nil {
		t.Fatalf("unmountRootfs: %v", err)
	}
	if mp, err := mount.IsMountPoint(rootfs); err != nil || mp {
		t.Errorf("after unmountRootfs: IsMountPoint got %v, %v, want false", mp, err)
	}
	if err := snaps.Remove(ctx, id); err != nil {
		t.Errorf("remove the writable layer: got %v, want nil", err)
	}
	if err := d.unmountRootfs(ctx, id); err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Errorf("unmountRootfs again: got %v, want nil (idempotent)", err)
	}
}

func snapsDir(state string) string { return filepath.Join(state, "snapshots") }
