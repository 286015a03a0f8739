package image

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/testimage"
)

// ImportKeep never replaces what a name holds: the same image again
// returns it, another image under the name is FailedPrecondition and the
// name keeps the first (a gateway imports so for every tenant of a
// cluster); Import replaces as before.
func TestImportKeepRefusesAnotherImage(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	const name = "example.com/shared/img:1"
	dir := t.TempDir()
	first, second := filepath.Join(dir, "first.tar"), filepath.Join(dir, "second.tar")
	if err := testimage.WriteOCIArchive(testimage.BusyboxT(t), name, first); err != nil {
		t.Fatal(err)
	}
	if err := testimage.WriteOCIArchive(testimage.WithFilesT(t, testimage.BusyboxT(t), map[string]string{"etc/other": "x\n"}), name, second); err != nil {
		t.Fatal(err)
	}
	a, err := s.ImportKeep(ctx, first, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	if again, err := s.ImportKeep(ctx, first, "", nil); err != nil || again.Digest != a.Digest {
		t.Fatalf("the same image again: %+v, %v", again, err)
	}
	if _, err := s.ImportKeep(ctx, second, "", nil); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("another image under a taken name: %v, want FailedPrecondition", err)
	}
	if got, err := s.Get(ctx, name); err != nil || got.Digest != a.Digest {
		t.Fatalf("after the refused import the name holds %+v, %v; want %s", got, err, a.Digest)
	}
	b, err := s.Import(ctx, second, "", nil)
	if err != nil || b.Digest == a.Digest {
		t.Fatalf("Import replaces: %+v, %v", b, err)
	}
	if got, _ := s.Get(ctx, name); got.Digest != b.Digest {
		t.Fatalf("after Import the name holds %s, want %s", got.Digest, b.Digest)
	}
}
