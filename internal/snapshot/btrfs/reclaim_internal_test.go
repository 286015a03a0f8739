package btrfs

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/internal/snapshot/testsuite"
)

// TestReclaimStuckSubvolume: a deleted subvolume that an open file keeps
// from the cleaner does not hold Reclaim until its caller's deadline (the
// wait ends once nothing moves), and gives nothing back; once the file is
// closed, Reclaim waits for the drop and says it freed space.
func TestReclaimStuckSubvolume(t *testing.T) {
	ctx := context.Background()
	testsuite.Require(t, Supported(ctx) == nil, "btrfs unsupported here")
	root := filepath.Join(t.TempDir(), "snaps")
	s, err := Open(ctx, root, Options{LoopSize: 256 << 20})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() {
		s.Close()
		if err := Detach(context.Background(), root); err != nil {
			t.Errorf("Detach: %v", err)
		}
	})
	b := &backend{root: root, log: slog.Default()}
	sub := filepath.Join(root, "stuck")
	if err := createSubvolume(sub); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(sub, "data"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(make([]byte, 4<<20)); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := removePath(sub); err != nil {
		t.Fatal(err)
	}

	// The budget is far longer than the stall that should end the wait.
	budget, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	freed, err := b.Reclaim(budget)
	if err != nil || freed {
		t.Errorf("Reclaim with the subvolume held: freed %v, %v; want false, nil", freed, err)
	}
	if budget.Err() != nil {
		t.Errorf("Reclaim waited for its caller's deadline with the subvolume held; want it to stop once nothing moved")
	}
	if n, err := pendingDeletions(mustOpen(t, root)); err != nil || n != 1 {
		t.Errorf("pending deletions with the subvolume held: %d, %v; want 1", n, err)
	}

	f.Close()
	freed, err = b.Reclaim(budget)
	if err != nil || !freed {
		t.Errorf("Reclaim once the file is closed: freed %v, %v; want true, nil", freed, err)
	}
	if n, err := pendingDeletions(mustOpen(t, root)); err != nil || n != 0 {
		t.Errorf("pending deletions after the drop: %d, %v; want 0", n, err)
	}
}

func mustOpen(t *testing.T, dir string) int {
	t.Helper()
	fd, err := openDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return fd
}
