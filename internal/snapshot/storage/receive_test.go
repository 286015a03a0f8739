package storage

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/forkbox/forkbox/errdefs"
)

// A received checkpoint's top, which its sender wrote, is its upper layer
// and at most overlay's scratch directory, both real directories: the
// store follows those paths, and a symlink there (to another checkpoint,
// a live sandbox's layer, the store's metadata) or anything beside them
// is refused, and the received data goes.
func TestReceiveRefusesForeignTop(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		write func(t *testing.T, dst string)
		ok    bool
	}{
		{"upper and work", func(t *testing.T, dst string) { mkdirs(t, dst, "upper/etc", "work") }, true},
		{"upper only", func(t *testing.T, dst string) { mkdirs(t, dst, "upper") }, true},
		{"no upper", func(t *testing.T, dst string) { mkdirs(t, dst, "work") }, false},
		{"upper a symlink to another checkpoint", func(t *testing.T, dst string) {
			mkdirs(t, dst)
			symlink(t, "../other/upper", filepath.Join(dst, "upper"))
		}, false},
		{"work a symlink to the metadata", func(t *testing.T, dst string) {
			mkdirs(t, dst, "upper")
			symlink(t, "../../meta", filepath.Join(dst, "work"))
		}, false},
		{"upper a file", func(t *testing.T, dst string) {
			mkdirs(t, dst)
			os.WriteFile(filepath.Join(dst, "upper"), nil, 0o644)
		}, false},
		{"something beside", func(t *testing.T, dst string) { mkdirs(t, dst, "upper", "extra") }, false},
	} {
		s, err := Open(ctx, filepath.Join(t.TempDir(), "snaps"), &fullBackend{}, nil)
		if err != nil {
			t.Fatal(err)
		}
		err = s.Receive(ctx, "ck", func(_ context.Context, dir string) error {
			tc.write(t, filepath.Join(dir, "ck"))
			return nil
		})
		if tc.ok != (err == nil) || (err != nil && !errdefs.IsInvalidArgument(err)) {
			t.Errorf("%s: got %v, want ok=%v (else InvalidArgument)", tc.name, err, tc.ok)
		}
		if _, serr := os.Lstat(filepath.Join(s.root, dirCommitted, "ck")); !tc.ok && serr == nil {
			t.Errorf("%s: the refused data is left", tc.name)
		}
	}
}

func mkdirs(t *testing.T, dst string, dirs ...string) {
	t.Helper()
	if err := os.Mkdir(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, d := range dirs {
		if err := os.MkdirAll(filepath.Join(dst, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

func symlink(t *testing.T, target, at string) {
	t.Helper()
	if err := os.Symlink(target, at); err != nil {
		t.Fatal(err)
	}
}
