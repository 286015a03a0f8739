package testsuite

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/snapshot"
)

const mib = 1 << 20

// fillFile appends 1 MiB chunks to path, each synced, until max bytes are
// written or a write fails; it returns what was written and the error.
func fillFile(t testing.TB, path string, max int64) (int64, error) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	buf := make([]byte, mib)
	var n int64
	for n < max {
		for i := range buf {
			buf[i] = byte(int(n>>20)*13 + i*7) // incompressible enough, distinct per chunk
		}
		w, err := f.Write(buf)
		n += int64(w)
		if err == nil {
			err = f.Sync()
		}
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// IsDiskFull reports whether err is what a write past a disk limit or on a
// full filesystem returns.
func IsDiskFull(err error) bool {
	return errors.Is(err, unix.EDQUOT) || errors.Is(err, unix.ENOSPC)
}

// expectFull writes up to max bytes to path and fails t unless the writes
// stop with EDQUOT or ENOSPC after at least min and at most max bytes.
func expectFull(t *testing.T, path string, min, max int64) {
	t.Helper()
	n, err := fillFile(t, path, max)
	switch {
	case err == nil:
		t.Errorf("wrote %d MiB to %s: got no error, want EDQUOT before %d MiB", n/mib, path, max/mib)
	case !IsDiskFull(err):
		t.Errorf("write to %s after %d MiB: got %v, want EDQUOT or ENOSPC", path, n/mib, err)
	case n < min:
		t.Errorf("write to %s: got EDQUOT after %d MiB, want at least %d MiB first", path, n/mib, min/mib)
	}
}

func expectFits(t *testing.T, path string, size int64) {
	t.Helper()
	if n, err := fillFile(t, path, size); err != nil {
		t.Errorf("write %d MiB to %s: got %v after %d MiB, want it to fit", size/mib, path, err, n/mib)
	}
}

// testDiskLimit: a limited active snapshot stops writes at its limit; a
// child is charged only for its own writes, also after its parent is gone;
// the limit survives a restart. An implementation that cannot enforce
// limits refuses them with FailedPrecondition and creates nothing.
func testDiskLimit(t *testing.T, ctx context.Context, s snapshot.Snapshotter, reopen reopenFunc) {
	lower := makeLower(t)
	err := s.Prepare(ctx, "p", "", snapshot.WithDiskLimit(24*mib))
	if errdefs.IsFailedPrecondition(err) {
		if infos, lerr := s.List(ctx); lerr != nil || len(infos) != 0 {
			t.Errorf("refused limit left snapshots behind: List: %v, %v", infos, lerr)
		}
		must(t, s.Prepare(ctx, "p", ""))
		must(t, s.Commit(ctx, "c", "p"))
		if err := s.Prepare(ctx, "child", "c", snapshot.WithDiskLimit(mib)); !errdefs.IsFailedPrecondition(err) {
			t.Errorf("Prepare child with a limit: got %v, want FailedPrecondition", err)
		}
		if _, err := s.Stat(ctx, "child"); !errdefs.IsNotFound(err) {
			t.Errorf("refused child left behind: Stat: %v", err)
		}
		t.Logf("limits not supported: %v", err)
		return
	}
	must(t, err)
	if info, _ := s.Stat(ctx, "p"); info.DiskLimit != 24*mib {
		t.Errorf("Stat(p).DiskLimit: got %d, want %d", info.DiskLimit, 24*mib)
	}
	proot, unmount := MountRootfs(t, s, "p", []string{lower})
	// The parent holds 16 MiB, more than its child's limit below.
	expectFits(t, filepath.Join(proot, "big"), 16*mib)
	expectFull(t, filepath.Join(proot, "more"), 4*mib, 64*mib)
	must(t, os.Remove(filepath.Join(proot, "more")))
	must(t, syncfs(proot))
	must(t, s.Commit(ctx, "c", "p"))
	if info, _ := s.Stat(ctx, "c"); info.DiskLimit != 0 {
		t.Errorf("Stat(c).DiskLimit: got %d, want 0", info.DiskLimit)
	}
	unmount()

	// The child is not charged for the 16 MiB it shares with c.
	must(t, s.Prepare(ctx, "child", "c", snapshot.WithDiskLimit(8*mib)))
	croot, cunmount := MountRootfs(t, s, "child", []string{lower})
	expect(t, filepath.Join(croot, "etc/os-release"), "lower")
	expectFits(t, filepath.Join(croot, "own"), 2*mib)
	// Charged counts what the limit counts: its own 2 MiB, not the 16 MiB
	// it shares with c.
	must(t, syncfs(croot))
	if ch, err := s.Charged(ctx, "child"); err != nil || ch < 2*mib || ch > 4*mib {
		t.Errorf("Charged(child): got %d, %v, want about 2 MiB", ch, err)
	}
	cunmount()
	// Nor once c and p, the other holders of that data, are gone.
	must(t, s.Remove(ctx, "c"))
	must(t, s.Remove(ctx, "p"))
	s = reopen()
	if info, _ := s.Stat(ctx, "child"); info.DiskLimit != 8*mib {
		t.Errorf("Stat(child).DiskLimit after restart: got %d, want %d", info.DiskLimit, 8*mib)
	}
	croot, _ = MountRootfs(t, s, "child", []string{lower})
	expectFits(t, filepath.Join(croot, "own2"), 2*mib)
	// The limit survives the restart.
	expectFull(t, filepath.Join(croot, "more"), 1*mib, 64*mib)
	// A sibling without a limit is not limited.
	must(t, s.Prepare(ctx, "free", ""))
	froot, _ := MountRootfs(t, s, "free", []string{lower})
	expectFits(t, filepath.Join(froot, "big"), 32*mib)
}
