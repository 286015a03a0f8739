package image

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/testimage"
)

// TestImportFromTakesNoTag: a peer names both the reference and the
// digest of what it sends, so its image is stored only as
// repository@digest: the tag it names stays free here (a sandbox created
// by that name later does not run the peer's image), and a reference
// whose own digest is another is refused with nothing stored.
func TestImportFromTakesNoTag(t *testing.T) {
	p := newPeerPair(t)
	b, _ := newStore(t)
	ctx := context.Background()
	got, err := b.ImportFrom(ctx, "example.com/peer/img:1", p.img.Digest, p.fetch(nil), nil)
	if want := "example.com/peer/img@" + p.img.Digest; err != nil || got.Name != want {
		t.Fatalf("ImportFrom: got %q, %v; want %q", got.Name, err, want)
	}
	for _, n := range []string{"example.com/peer/img:1", "example.com/peer/img"} {
		if img, err := b.Get(ctx, n); !errdefs.IsNotFound(err) {
			t.Errorf("Get(%q) after a peer's import: got %s, %v; want NotFound", n, img.Digest, err)
		}
	}
	if img, err := b.Get(ctx, p.img.Digest); err != nil || img.Digest != p.img.Digest {
		t.Errorf("Get(digest): got %s, %v", img.Digest, err)
	}

	c, _ := newStore(t)
	other := "sha256:" + strings.Repeat("ab", 32)
	_, err = c.ImportFrom(ctx, "example.com/peer/img@"+other, p.img.Digest, p.fetch(nil), nil)
	if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), other) {
		t.Fatalf("a reference of another digest: got %v, want InvalidArgument naming %s", err, other)
	}
	requireEmpty(t, c)
}

// TestImportFromKeepsAConcurrentName: an image stored under the name a
// peer's import is about to take, while it fetches, stays: the import
// adds its record only if the name is free, and says it was taken.
func TestImportFromKeepsAConcurrentName(t *testing.T) {
	p := newPeerPair(t)
	b, _ := newStore(t)
	ctx := context.Background()
	name := "example.com/peer/img@" + p.img.Digest
	mine := filepath.Join(t.TempDir(), "mine.tar")
	if err := testimage.WriteOCIArchive(testimage.BusyboxT(t), name, mine); err != nil {
		t.Fatal(err)
	}
	var once atomic.Bool
	var local Image
	fetch := func(ctx context.Context, d string) (io.ReadCloser, error) {
		if once.CompareAndSwap(false, true) { // after the name was checked
			var err error
			if local, err = b.Import(ctx, mine, "", nil); err != nil {
				t.Errorf("Import meanwhile: %v", err)
			}
		}
		return p.fetch(nil)(ctx, d)
	}
	_, err := b.ImportFrom(ctx, "example.com/peer/img:1", p.img.Digest, fetch, nil)
	if !errdefs.IsAlreadyExists(err) {
		t.Fatalf("ImportFrom over a name taken meanwhile: got %v, want AlreadyExists", err)
	}
	if local.Name != name {
		t.Fatalf("the local image is %q, want %q", local.Name, name)
	}
	if got, err := b.Get(ctx, name); err != nil || got.Digest != local.Digest {
		t.Errorf("the name after the import: got %s, %v; want the local %s", got.Digest, err, local.Digest)
	}
}

// TestImportFromChecksKeptBlobOfHeldLayer: a layer unpacked here already
// (from a docker archive, which keeps no blobs) is not unpacked again,
// but the peer's blob kept for it must hold that layer: a blob of the
// manifest's digest whose tar stream is another is refused, not kept to
// be served to other nodes as this layer.
func TestImportFromChecksKeptBlobOfHeldLayer(t *testing.T) {
	p := newPeerPair(t)
	b, _ := newStore(t)
	ctx := context.Background()
	docker := filepath.Join(t.TempDir(), "docker.tar")
	img := testimage.WithFilesT(t, testimage.BusyboxT(t), map[string]string{"etc/motd": "from the sender\n"})
	if err := testimage.WriteDockerArchive(img, "example.com/k/docker:1", docker); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Import(ctx, docker, "", nil); err != nil {
		t.Fatal(err)
	}
	// The peer's manifest: its config (the diff IDs held here), the top
	// layer's blob replaced by a gzip of something else.
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write([]byte(strings.Repeat("not the layer ", 1000)))
	zw.Close()
	bogus := gz.Bytes()
	m := *p.m
	m.Layers = append([]v1.Descriptor(nil), p.m.Layers...)
	top := len(m.Layers) - 1
	m.Layers[top].Digest = mustHash(t, digestOf(bogus))
	m.Layers[top].Size = int64(len(bogus))
	raw, _ := json.Marshal(&m)
	fetch := func(ctx context.Context, d string) (io.ReadCloser, error) {
		switch d {
		case digestOf(raw):
			return io.NopCloser(bytes.NewReader(raw)), nil
		case digestOf(bogus):
			return io.NopCloser(bytes.NewReader(bogus)), nil
		}
		return p.fetch(nil)(ctx, d)
	}
	_, err := b.ImportFrom(ctx, "example.com/peer/img:1", digestOf(raw), fetch, nil)
	if !errdefs.IsInvalidArgument(err) {
		t.Fatalf("a kept blob that is not the layer: got %v, want InvalidArgument", err)
	}
	if _, err := os.Stat(b.blobPath(digestOf(bogus))); !os.IsNotExist(err) {
		t.Errorf("the bogus blob: got %v, want none kept", err)
	}
	if _, err := b.Get(ctx, digestOf(raw)); !errdefs.IsNotFound(err) {
		t.Errorf("the peer's image: got %v, want NotFound", err)
	}
}

// TestOpenCollectsOrphanBlobs: a blob no image lists (a crash between
// keeping it and recording its image) is gone after Open; the blobs of
// images stay.
func TestOpenCollectsOrphanBlobs(t *testing.T) {
	p := newPeerPair(t)
	ctx := context.Background()
	orphan := "sha256:" + strings.Repeat("cd", 32)
	if err := os.WriteFile(p.sender.blobPath(orphan), []byte("left by a crash"), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := Open(ctx, p.sender.root, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(s.blobPath(orphan)); !os.IsNotExist(err) {
		t.Errorf("the orphan blob after Open: got %v, want gone", err)
	}
	f, _, err := s.OpenImageBlob(ctx, p.img.Digest, p.img.Digest)
	if err != nil {
		t.Fatalf("the image's manifest blob after Open: %v", err)
	}
	f.Close()
}

func mustHash(t *testing.T, d string) v1.Hash {
	t.Helper()
	h, err := v1.NewHash(d)
	if err != nil {
		t.Fatal(err)
	}
	return h
}
