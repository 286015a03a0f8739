package image

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
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

// peerPair is a sender store holding an OCI-imported image, and its
// manifest.
type peerPair struct {
	sender *Store
	img    Image
	m      *v1.Manifest
}

func newPeerPair(t *testing.T) peerPair {
	t.Helper()
	a, _ := newStore(t)
	ctx := context.Background()
	img := testimage.WithFilesT(t, testimage.BusyboxT(t), map[string]string{"etc/motd": "from the sender\n"})
	path := filepath.Join(t.TempDir(), "img.tar")
	if err := testimage.WriteOCIArchive(img, "example.com/peer/img:1", path); err != nil {
		t.Fatal(err)
	}
	got, err := a.Import(ctx, path, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	f, _, err := a.OpenImageBlob(ctx, got.Digest, got.Digest)
	if err != nil {
		t.Fatalf("OpenBlob(manifest): %v", err)
	}
	defer f.Close()
	m, err := v1.ParseManifest(f)
	if err != nil {
		t.Fatal(err)
	}
	return peerPair{sender: a, img: got, m: m}
}

// fetch serves the sender's blobs as OpenImageBlob does, counting the calls.
func (p peerPair) fetch(calls *atomic.Int32) FetchFunc {
	return func(ctx context.Context, digest string) (io.ReadCloser, error) {
		if calls != nil {
			calls.Add(1)
		}
		f, _, err := p.sender.OpenImageBlob(ctx, p.img.Digest, digest)
		if err != nil {
			return nil, err
		}
		return f, nil
	}
}

// requireEmpty checks that a store holds no image, layer, blob or staging.
func requireEmpty(t *testing.T, s *Store) {
	t.Helper()
	if l, _ := s.List(context.Background()); len(l) != 0 {
		t.Errorf("images: got %d, want none", len(l))
	}
	for _, d := range []string{s.layersDir(), s.blobsDir(), s.tmpDir()} {
		if ents, _ := os.ReadDir(d); len(ents) != 0 {
			t.Errorf("%s: got %d entries (%s…), want none", d, len(ents), ents[0].Name())
		}
	}
}

// TestImportFromPeer: a store without the image gets it from a peer's
// blobs, with the sender's manifest digest, layers and config, and keeps
// its blobs in turn (so it can pass the image on); asked again it fetches
// nothing. A name taken by another image here is not moved.
func TestImportFromPeer(t *testing.T) {
	p := newPeerPair(t)
	b, _ := newStore(t)
	ctx := context.Background()
	var calls atomic.Int32
	got, err := b.ImportFrom(ctx, p.img.Name, p.img.Digest, p.fetch(&calls), nil)
	if err != nil {
		t.Fatalf("ImportFrom: %v", err)
	}
	if got.Digest != p.img.Digest || got.Name != "example.com/peer/img@"+p.img.Digest || got.Size != p.img.Size || len(got.Layers) != len(p.img.Layers) {
		t.Fatalf("imported: got %s %s %d bytes %d layers, want %s %s %d bytes %d layers",
			got.Name, got.Digest, got.Size, len(got.Layers), "example.com/peer/img@"+p.img.Digest, p.img.Digest, p.img.Size, len(p.img.Layers))
	}
	if want := int32(2 + len(p.m.Layers)); calls.Load() != want {
		t.Errorf("blobs fetched: got %d, want %d (manifest, config, layers)", calls.Load(), want)
	}
	if bs, err := os.ReadFile(filepath.Join(got.Layers[1], "etc/motd")); err != nil || string(bs) != "from the sender\n" {
		t.Errorf("etc/motd: got %q, %v", bs, err)
	}
	if fmt.Sprint(got.Config) != fmt.Sprint(p.img.Config) {
		t.Errorf("config: got %+v, want %+v", got.Config, p.img.Config)
	}
	for _, d := range append([]string{p.img.Digest, p.m.Config.Digest.String()}, layerDigests(p.m)...) {
		f, _, err := b.OpenImageBlob(ctx, p.img.Digest, d)
		if err != nil {
			t.Errorf("the receiver's blob %s: %v", d, err)
			continue
		}
		f.Close()
	}
	calls.Store(0)
	if _, err := b.ImportFrom(ctx, p.img.Name, p.img.Digest, p.fetch(&calls), nil); err != nil || calls.Load() != 0 {
		t.Errorf("second ImportFrom: %d fetches, %v; want none, nil", calls.Load(), err)
	}

	// A third store holds another image under the same name: the peer's
	// goes in beside it, as repository@digest.
	c, _ := newStore(t)
	other := filepath.Join(t.TempDir(), "other.tar")
	if err := testimage.WriteOCIArchive(testimage.BusyboxT(t), p.img.Name, other); err != nil {
		t.Fatal(err)
	}
	mine, err := c.Import(ctx, other, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	got, err = c.ImportFrom(ctx, p.img.Name, p.img.Digest, p.fetch(nil), nil)
	if want := "example.com/peer/img@" + p.img.Digest; err != nil || got.Name != want {
		t.Errorf("ImportFrom beside another image of that name: got %q, %v; want %q", got.Name, err, want)
	}
	if still, err := c.Get(ctx, p.img.Name); err != nil || still.Digest != mine.Digest {
		t.Errorf("the name's own image: got %s, %v; want %s", still.Digest, err, mine.Digest)
	}
	// Both on one node share their base layer; removing the peer's image
	// deletes its blobs and its own layer only.
	if err := c.Remove(ctx, got.Name); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.OpenImageBlob(ctx, p.img.Digest, p.img.Digest); !errdefs.IsNotFound(err) {
		t.Errorf("manifest blob after Remove: got %v, want NotFound", err)
	}
	if _, err := os.Stat(c.blobPath(p.img.Digest)); !os.IsNotExist(err) {
		t.Errorf("manifest blob file after Remove: got %v, want none", err)
	}
	if _, err := os.Stat(mine.Layers[0]); err != nil {
		t.Errorf("the shared base layer after Remove: %v", err)
	}
}

func layerDigests(m *v1.Manifest) []string {
	var out []string
	for _, l := range m.Layers {
		out = append(out, l.Digest.String())
	}
	return out
}

// TestImportFromLyingPeer: a peer that sends other bytes than the digest
// asked for, more bytes than a descriptor says, a stream that stops
// short, a document past the limits, or not an image, is refused with
// the class of its fault, and the receiver is left as it was: no image,
// no layer, no blob, nothing staged.
func TestImportFromLyingPeer(t *testing.T) {
	p := newPeerPair(t)
	ctx := context.Background()
	top := p.m.Layers[len(p.m.Layers)-1].Digest.String()
	base := p.m.Layers[0].Digest.String()
	read := func(d string) []byte {
		f, _, err := p.sender.OpenImageBlob(ctx, p.img.Digest, d)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		b, _ := io.ReadAll(f)
		return b
	}
	// edit serves the sender's blobs, blob d changed by f.
	edit := func(d string, f func([]byte) io.Reader) FetchFunc {
		return func(ctx context.Context, digest string) (io.ReadCloser, error) {
			if digest == d {
				return io.NopCloser(f(read(d))), nil
			}
			return p.fetch(nil)(ctx, digest)
		}
	}
	flip := func(b []byte) io.Reader {
		b = bytes.Clone(b)
		b[len(b)/2] ^= 1
		return bytes.NewReader(b)
	}
	index, _ := json.Marshal(map[string]any{"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": []any{}})
	big := &v1.Manifest{SchemaVersion: 2, MediaType: "application/vnd.oci.image.manifest.v1+json", Config: p.m.Config,
		Layers: []v1.Descriptor{{MediaType: p.m.Layers[0].MediaType, Digest: p.m.Layers[0].Digest, Size: 1 << 40}}}
	bigRaw, _ := json.Marshal(big)
	for _, tc := range []struct {
		name   string
		digest string // asked for; "" the image's
		fetch  FetchFunc
		limits Limits
		want   func(error) bool
	}{
		{name: "manifest not of its digest", fetch: edit(p.img.Digest, flip), want: errdefs.IsInvalidArgument},
		{name: "config not of its digest", fetch: edit(p.m.Config.Digest.String(), flip), want: errdefs.IsInvalidArgument},
		{name: "layer blob not of its digest", fetch: edit(top, flip), want: errdefs.IsInvalidArgument},
		{name: "base layer blob not of its digest", fetch: edit(base, flip), want: errdefs.IsInvalidArgument},
		{name: "layer blob longer than its descriptor", fetch: edit(top, func(b []byte) io.Reader {
			return io.MultiReader(bytes.NewReader(b), strings.NewReader(strings.Repeat("x", 1<<20)))
		}), want: errdefs.IsInvalidArgument},
		{name: "endless layer blob", fetch: edit(base, func(b []byte) io.Reader {
			return io.MultiReader(bytes.NewReader(b), zeros{})
		}), want: errdefs.IsInvalidArgument},
		{name: "stream cut in a layer", fetch: edit(base, func(b []byte) io.Reader {
			return io.MultiReader(bytes.NewReader(b[:len(b)/2]), errReader{fmt.Errorf("connection reset: %w", errdefs.ErrUnavailable)})
		}), want: errdefs.IsUnavailable},
		{name: "layer blob short of its descriptor", fetch: edit(top, func(b []byte) io.Reader {
			return bytes.NewReader(b[:len(b)-1])
		}), want: errdefs.IsInvalidArgument},
		{name: "an index, not an image", digest: digestOf(index), fetch: func(ctx context.Context, d string) (io.ReadCloser, error) {
			return io.NopCloser(bytes.NewReader(index)), nil
		}, want: errdefs.IsInvalidArgument},
		{name: "a layer past the layer limit", digest: digestOf(bigRaw), fetch: func(ctx context.Context, d string) (io.ReadCloser, error) {
			if d == digestOf(bigRaw) {
				return io.NopCloser(bytes.NewReader(bigRaw)), nil
			}
			return p.fetch(nil)(ctx, d)
		}, want: errdefs.IsResourceExhausted},
		{name: "manifest past the manifest limit", limits: Limits{ManifestBytes: 64}, fetch: p.fetch(nil), want: errdefs.IsResourceExhausted},
		{name: "layers past the image limit", limits: Limits{LayerBytes: 1 << 20, ImageBytes: 1 << 20}, fetch: p.fetch(nil), want: errdefs.IsResourceExhausted},
		{name: "blob the sender lacks", fetch: func(ctx context.Context, d string) (io.ReadCloser, error) {
			if d == top {
				return nil, fmt.Errorf("blob %s: %w", d, errdefs.ErrNotFound)
			}
			return p.fetch(nil)(ctx, d)
		}, want: errdefs.IsNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, _ := newLimitedStore(t, tc.limits)
			d := tc.digest
			if d == "" {
				d = p.img.Digest
			}
			_, err := b.ImportFrom(ctx, p.img.Name, d, tc.fetch, nil)
			if !tc.want(err) {
				t.Fatalf("got %v, want %s", err, wantName(tc.want))
			}
			requireEmpty(t, b)
		})
	}
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

// TestOpenBlobConfined: the sender serves blobs only by digest, only of
// images it holds, only from its blob directory.
func TestOpenBlobConfined(t *testing.T) {
	p := newPeerPair(t)
	s := p.sender
	ctx := context.Background()
	// A file in b/ that no image lists, a layer directory's name, and a
	// link in place of a listed blob.
	orphan := []byte("not a blob of any image")
	if err := os.WriteFile(filepath.Join(s.blobsDir(), strings.TrimPrefix(digestOf(orphan), "sha256:")), orphan, 0o600); err != nil {
		t.Fatal(err)
	}
	diffID := "sha256:" + filepath.Base(p.img.Layers[1])
	for _, tc := range []struct {
		digest string
		want   func(error) bool
	}{
		{"../../../etc/passwd", errdefs.IsInvalidArgument},
		{"sha256:../../../../etc/passwd", errdefs.IsInvalidArgument},
		{"sha256:" + strings.Repeat("../", 21) + "x", errdefs.IsInvalidArgument},
		{"sha256:" + strings.ToUpper(strings.TrimPrefix(p.img.Digest, "sha256:")), errdefs.IsInvalidArgument},
		{"sha512:" + strings.Repeat("0", 128), errdefs.IsInvalidArgument},
		{"/etc/passwd", errdefs.IsInvalidArgument},
		{"", errdefs.IsInvalidArgument},
		{digestOf(orphan), errdefs.IsNotFound},
		{diffID, errdefs.IsNotFound},
		{digestOf([]byte("never stored")), errdefs.IsNotFound},
	} {
		f, _, err := s.OpenImageBlob(ctx, p.img.Digest, tc.digest)
		if err == nil {
			f.Close()
		}
		if !tc.want(err) {
			t.Errorf("OpenBlob(%q): got %v, want %s", tc.digest, err, wantName(tc.want))
		}
	}
	// A listed blob replaced by a link to a file outside is not followed.
	cfg := p.m.Config.Digest.String()
	if err := os.Remove(s.blobPath(cfg)); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc/passwd", s.blobPath(cfg)); err != nil {
		t.Fatal(err)
	}
	if f, _, err := s.OpenImageBlob(ctx, p.img.Digest, cfg); err == nil {
		b, _ := io.ReadAll(f)
		f.Close()
		t.Errorf("OpenBlob through a link: got %d bytes, want an error", len(b))
	}
	// An image imported from a docker archive keeps no blobs: nothing
	// of it is served.
	docker := filepath.Join(t.TempDir(), "docker.tar")
	if err := testimage.WriteDockerArchive(testimage.BusyboxT(t), "example.com/peer/docker:1", docker); err != nil {
		t.Fatal(err)
	}
	dimg, err := s.Import(ctx, docker, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.OpenImageBlob(ctx, dimg.Digest, dimg.Digest); !errdefs.IsNotFound(err) {
		t.Errorf("OpenBlob(docker-archive image's manifest): got %v, want NotFound", err)
	}
}

// TestBlobsKeptForLayersHeldAlready: an image whose layers the store
// unpacked already for an image that keeps no blobs (a docker archive)
// still keeps all its blobs when pulled or imported from a layout, so it
// can be shipped; removing it deletes them and keeps the shared layers.
func TestBlobsKeptForLayersHeldAlready(t *testing.T) {
	s, h := newStore(t)
	ctx := context.Background()
	img := testimage.BusyboxT(t)
	dir := t.TempDir()
	docker, oci := filepath.Join(dir, "docker.tar"), filepath.Join(dir, "oci.tar")
	if err := testimage.WriteDockerArchive(img, "example.com/k/docker:1", docker); err != nil {
		t.Fatal(err)
	}
	if err := testimage.WriteOCIArchive(img, "example.com/k/oci:1", oci); err != nil {
		t.Fatal(err)
	}
	d, err := s.Import(ctx, docker, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	o, err := s.Import(ctx, oci, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	for l, n := range h.n {
		if n != 1 {
			t.Errorf("layer %s unpacked %d times, want once", l, n)
		}
	}
	m := manifestOfStore(t, s, o.Digest)
	for _, dg := range append([]string{m.Config.Digest.String()}, layerDigests(m)...) {
		f, _, err := s.OpenImageBlob(ctx, o.Digest, dg)
		if err != nil {
			t.Errorf("blob %s of the OCI image: %v", dg, err)
			continue
		}
		f.Close()
	}
	if err := s.Remove(ctx, o.Name); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(s.blobsDir()); len(ents) != 0 {
		t.Errorf("blobs after the OCI image's removal: %d, want none", len(ents))
	}
	for _, l := range d.Layers {
		if _, err := os.Stat(l); err != nil {
			t.Errorf("the docker image's layer after the OCI image's removal: %v", err)
		}
	}
}

func manifestOfStore(t *testing.T, s *Store, digest string) *v1.Manifest {
	t.Helper()
	f, _, err := s.OpenImageBlob(context.Background(), digest, digest)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m, err := v1.ParseManifest(f)
	if err != nil {
		t.Fatal(err)
	}
	return m
}
