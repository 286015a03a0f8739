package transfer

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/image"
	"github.com/forkbox/forkbox/internal/store"
	"github.com/forkbox/forkbox/internal/testimage"
)

// withImages gives n an image store under its dir, its checkpoints'
// images read from its ledger, as the daemon does.
func (n *node) withImages(t testing.TB) *image.Store {
	t.Helper()
	st, err := image.Open(context.Background(), n.imagesDir(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	n.local.Images = ImageStore{Store: st, Checkpoint: func(ctx context.Context, id string) (string, string, error) {
		ck, err := n.ledger.GetCheckpoint(ctx, id)
		if err != nil {
			return "", "", err
		}
		return ck.Image, ck.ImageDigest, nil
	}}
	return st
}

func (n *node) imagesDir() string { return filepath.Join(n.dir, "images") }

// importImage imports an OCI archive of busybox with file etc/motd.
func importImage(t testing.TB, st *image.Store, ref, motd string) image.Image {
	t.Helper()
	img := testimage.WithFilesT(t, testimage.BusyboxT(t), map[string]string{"etc/motd": motd})
	path := filepath.Join(t.TempDir(), "img.tar")
	if err := testimage.WriteOCIArchive(img, ref, path); err != nil {
		t.Fatal(err)
	}
	got, err := st.Import(context.Background(), path, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// checkpointOn commits key as checkpoint id of a sandbox running img.
func (n *node) checkpointOn(t testing.TB, id, key string, img image.Image) {
	t.Helper()
	ctx := context.Background()
	if err := n.snaps.Commit(ctx, id, key); err != nil {
		t.Fatal(err)
	}
	ck := &store.Checkpoint{ID: id, SandboxID: key, Tag: id, Kind: "filesystem", Image: img.Name, ImageDigest: img.Digest, Runtime: "gvisor"}
	if err := n.ledger.AddCheckpoint(ctx, ck); err != nil {
		t.Fatal(err)
	}
}

// requireNoImage checks that n's image store holds no image, layer, blob
// or staging.
func (n *node) requireNoImage(t testing.TB, st *image.Store) {
	t.Helper()
	if l, _ := st.List(context.Background()); len(l) != 0 {
		t.Errorf("%s: %d images, want none", n.name, len(l))
	}
	for _, d := range []string{"l", "b", "tmp"} {
		if ents, _ := os.ReadDir(filepath.Join(n.imagesDir(), d)); len(ents) != 0 {
			t.Errorf("%s: images/%s holds %s (and %d more), want nothing", n.name, d, ents[0].Name(), len(ents)-1)
		}
	}
}

// TestImageTravelsWithCheckpoint: a node without the checkpoint's image
// gets it from the sender by digest (manifest, config, layers), then the
// checkpoint; a child of it has the image's layers and the checkpoint's
// files. Asked again, nothing travels.
func TestImageTravelsWithCheckpoint(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	trust := StaticTrust{}
	a, b := newNode(t, "a", trust), newNode(t, "b", trust)
	aImgs, bImgs := a.withImages(t), b.withImages(t)
	img := importImage(t, aImgs, "example.com/t/img:1", "from a's image\n")
	data := a.write(t, "sb-1", "", "work", mb)
	a.checkpointOn(t, "ck-1", "sb-1", img)
	// Not granted the checkpoint, b is told nothing of its image.
	if _, err := b.client.EnsureImage(ctx, a.peer(), "ck-1"); !errdefs.IsPermissionDenied(err) {
		t.Fatalf("EnsureImage without a grant of the checkpoint: got %v, want PermissionDenied", err)
	}
	b.requireNoImage(t, bImgs)
	a.grant(b, "ck-1")

	res, err := b.client.EnsureImage(ctx, a.peer(), "ck-1")
	if err != nil {
		t.Fatalf("EnsureImage: %v", err)
	}
	t.Logf("image: %+v", res)
	if !res.Fetched || res.Digest != img.Digest || res.Ref != img.Name || res.Bytes < 100<<10 {
		t.Errorf("EnsureImage: got %+v, want %s (%s) fetched, its layers' bytes", res, img.Name, img.Digest)
	}
	if _, err := b.client.Pull(ctx, a.peer(), Request{Checkpoint: "ck-1", UUID: a.uuid(t, "ck-1")}); err != nil {
		t.Fatalf("pull: %v", err)
	}
	ck, err := b.ledger.GetCheckpoint(ctx, "ck-1")
	if err != nil {
		t.Fatal(err)
	}
	// What a child of the checkpoint needs on b: the image of the
	// checkpoint's digest (as the daemon looks it up) and a writable
	// snapshot of the checkpoint.
	got, err := bImgs.Get(ctx, ck.ImageDigest)
	if err != nil || got.Digest != img.Digest || len(got.Layers) != len(img.Layers) {
		t.Fatalf("b's image %s: got %+v, %v", ck.ImageDigest, got, err)
	}
	if motd, err := os.ReadFile(filepath.Join(got.Layers[len(got.Layers)-1], "etc/motd")); err != nil || string(motd) != "from a's image\n" {
		t.Errorf("b's image etc/motd: got %q, %v", motd, err)
	}
	if sh, err := os.Lstat(filepath.Join(got.Layers[0], "bin/sh")); err != nil || sh.Mode()&os.ModeSymlink == 0 && !sh.Mode().IsRegular() {
		t.Errorf("b's image bin/sh: %v", err)
	}
	if err := b.snaps.Prepare(ctx, "child", "ck-1"); err != nil {
		t.Fatal(err)
	}
	if w, err := os.ReadFile(filepath.Join(b.root(), "active", "child", "upper", "work")); err != nil || !bytes.Equal(w, data) {
		t.Errorf("child's work file: %d bytes, %v", len(w), err)
	}
	if err := os.WriteFile(filepath.Join(b.root(), "active", "child", "upper", "new"), []byte("x"), 0o644); err != nil {
		t.Errorf("write into the child: %v", err)
	}

	again, err := b.client.EnsureImage(ctx, a.peer(), "ck-1")
	if err != nil || again.Fetched || again.Bytes != 0 {
		t.Errorf("second EnsureImage: got %+v, %v; want nothing fetched", again, err)
	}
	// b can pass the image on: it keeps the blobs it verified.
	for _, d := range []string{img.Digest} {
		if f, _, err := bImgs.OpenImageBlob(ctx, img.Digest, d); err != nil {
			t.Errorf("b's blob %s: %v", d, err)
		} else {
			f.Close()
		}
	}
}

// lyingImages serves a's real image store, with blob lie changed by open.
type lyingImages struct {
	Images
	lie  string
	open func(b []byte) (io.Reader, int64)
	ref  string // if set, CheckpointImage answers this digest
	// stall: after what open gives, the blob stalls until its request
	// ends.
	stall bool
}

func (l lyingImages) OpenBlob(ctx context.Context, image, d string) (io.ReadCloser, int64, error) {
	rc, n, err := l.Images.OpenBlob(ctx, image, d)
	if err != nil || d != l.lie {
		return rc, n, err
	}
	defer rc.Close()
	b, _ := io.ReadAll(rc)
	r, size := l.open(b)
	if l.stall {
		r = io.MultiReader(r, stallReader{ctx})
	}
	return io.NopCloser(r), size, nil
}

// stallReader blocks until ctx ends.
type stallReader struct{ ctx context.Context }

func (s stallReader) Read([]byte) (int, error) {
	<-s.ctx.Done()
	return 0, s.ctx.Err()
}

func (l lyingImages) CheckpointImage(ctx context.Context, id string) (string, string, error) {
	ref, d, err := l.Images.CheckpointImage(ctx, id)
	if l.ref != "" {
		d = l.ref
	}
	return ref, d, err
}

// TestLyingImageSender: a sender that serves other bytes than a digest
// names, more than it declares, a stream cut short, more than the
// receiver's limit, a stream that stalls past the receiver's timeout, or
// names a digest that is not one, is refused with the class of its
// fault, and the receiver's image store is left empty.
func TestLyingImageSender(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	trust := StaticTrust{}
	a, b := newNode(t, "a", trust), newNode(t, "b", trust)
	aImgs, bImgs := a.withImages(t), b.withImages(t)
	img := importImage(t, aImgs, "example.com/t/img:1", "x\n")
	a.write(t, "sb-1", "", "work", mb)
	a.checkpointOn(t, "ck-1", "sb-1", img)
	a.grant(b, "ck-1")
	honest := a.local.Images
	m := manifestOf(t, aImgs, img.Digest)
	top := m.Layers[len(m.Layers)-1].Digest.String()
	flip := func(b []byte) (io.Reader, int64) {
		b = bytes.Clone(b)
		b[len(b)/2] ^= 1
		return bytes.NewReader(b), int64(len(b))
	}
	for _, tc := range []struct {
		name  string
		lie   lyingImages
		limit int64
		want  func(error) bool
	}{
		{"manifest not of its digest", lyingImages{lie: img.Digest, open: flip}, 0, errdefs.IsInvalidArgument},
		{"config not of its digest", lyingImages{lie: m.Config.Digest.String(), open: flip}, 0, errdefs.IsInvalidArgument},
		{"layer not of its digest", lyingImages{lie: top, open: flip}, 0, errdefs.IsInvalidArgument},
		{"layer longer than its descriptor", lyingImages{lie: top, open: func(b []byte) (io.Reader, int64) {
			return io.MultiReader(bytes.NewReader(b), bytes.NewReader(make([]byte, mb))), int64(len(b) + mb)
		}}, 0, errdefs.IsInvalidArgument},
		{"stream cut", lyingImages{lie: top, open: func(b []byte) (io.Reader, int64) {
			return bytes.NewReader(b[:len(b)/2]), int64(len(b))
		}}, 0, errdefs.IsUnavailable},
		{"a digest that is a path", lyingImages{ref: "sha256:../../../../etc/passwd"}, 0, errdefs.IsInvalidArgument},
		{"an image the sender does not keep", lyingImages{ref: "sha256:" + strings.Repeat("ab", 32)}, 0, errdefs.IsNotFound},
		{"past the receiver's limit", lyingImages{}, 64 << 10, errdefs.IsResourceExhausted},
		{"a sender that stalls", lyingImages{lie: top, stall: true, open: func(b []byte) (io.Reader, int64) {
			return bytes.NewReader(b[:len(b)/2]), int64(len(b))
		}}, 0, errdefs.IsDeadlineExceeded},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.lie.Images = honest
			a.local.Images = tc.lie
			defer func() { a.local.Images = honest }()
			c := &Client{Identity: b.id, Local: b.local, Limits: Limits{MaxBytes: tc.limit, Timeout: 30 * time.Second}}
			if tc.lie.stall {
				c.Limits.Timeout = 2 * time.Second
			}
			_, err := c.EnsureImage(ctx, a.peer(), "ck-1")
			if !tc.want(err) {
				t.Fatalf("got %v, want another class", err)
			}
			b.requireNoImage(t, bImgs)
		})
	}
	// The honest sender's image then goes through.
	if res, err := b.client.EnsureImage(ctx, a.peer(), "ck-1"); err != nil || !res.Fetched {
		t.Fatalf("EnsureImage from the honest sender: %+v, %v", res, err)
	}
}

func manifestOf(t testing.TB, st *image.Store, digest string) *v1.Manifest {
	t.Helper()
	f, _, err := st.OpenImageBlob(context.Background(), digest, digest)
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

// TestBlobEndpointConfined: over the channel, a trusted peer gets blobs
// only by digest and only of the image of a checkpoint it may pull:
// paths, digests the sender does not hold, another image it holds, a
// layer directory's name, a file put in the blob directory by hand, and
// the image of a checkpoint it lacks are refused with NotFound or
// InvalidArgument, a checkpoint it is not granted with PermissionDenied,
// and no byte of a file outside.
func TestBlobEndpointConfined(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	trust := StaticTrust{}
	a, b := newNode(t, "a", trust), newNode(t, "b", trust)
	aImgs := a.withImages(t)
	b.withImages(t)
	img := importImage(t, aImgs, "example.com/t/img:1", "x\n")
	a.write(t, "sb-1", "", "work", mb)
	a.checkpointOn(t, "ck-1", "sb-1", img)
	other := importImage(t, aImgs, "example.com/t/other:1", "another image\n")
	a.write(t, "sb-2", "", "work", mb)
	a.checkpointOn(t, "ck-2", "sb-2", img) // not granted to b
	a.grant(b, "ck-1", "ck-none")
	orphan := []byte("a file nobody listed")
	orphanDigest := fmt.Sprintf("sha256:%x", sha256.Sum256(orphan))
	if err := os.WriteFile(filepath.Join(a.imagesDir(), "b", strings.TrimPrefix(orphanDigest, "sha256:")), orphan, 0o600); err != nil {
		t.Fatal(err)
	}
	pinned, _ := CertDER(a.id.CertPEM)
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: clientTLS(b.id, pinned)}}
	defer hc.CloseIdleConnections()
	secret, _ := os.ReadFile("/etc/passwd")
	get := func(path string) (int, []byte) {
		resp, err := hc.Get("https://" + a.addr + path)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		return resp.StatusCode, body
	}
	blobs := "/v1/checkpoints/ck-1/blobs/"
	for _, tc := range []struct {
		path string
		want []int
	}{
		{"/v1/checkpoints/ck-2/blobs/" + img.Digest, []int{http.StatusForbidden}},
		{"/v1/checkpoints/..%2Fck-1/blobs/" + img.Digest, []int{http.StatusBadRequest}},
		{blobs + other.Digest, []int{http.StatusNotFound}},
		{blobs + "..%2F..%2F..%2F..%2Fetc%2Fpasswd", []int{http.StatusBadRequest}},
		{blobs + "sha256:..%2F..%2F..%2Fetc%2Fpasswd", []int{http.StatusBadRequest}},
		{blobs + "%2Fetc%2Fpasswd", []int{http.StatusBadRequest}},
		{blobs + "../../../etc/passwd", []int{http.StatusNotFound, http.StatusMovedPermanently}},
		{blobs + orphanDigest, []int{http.StatusNotFound}},
		{blobs + "sha256:" + filepath.Base(img.Layers[1]), []int{http.StatusNotFound}},
		{blobs + "sha256:" + strings.Repeat("0", 64), []int{http.StatusNotFound}},
		{blobs + "sha256:" + strings.ToUpper(strings.Repeat("ab", 32)), []int{http.StatusBadRequest}},
	} {
		code, body := get(tc.path)
		ok := false
		for _, w := range tc.want {
			ok = ok || code == w
		}
		if !ok {
			t.Errorf("GET %s: got %d %q, want %v", tc.path, code, body, tc.want)
		}
		if len(secret) > 0 && bytes.Contains(body, secret[:min(len(secret), 32)]) {
			t.Errorf("GET %s: the answer holds /etc/passwd", tc.path)
		}
	}
	// The manifest of an image held is served.
	if code, body := get(blobs + img.Digest); code != http.StatusOK || fmt.Sprintf("sha256:%x", sha256.Sum256(body)) != img.Digest {
		t.Errorf("GET the manifest: got %d, %d bytes", code, len(body))
	}
	// The image of a checkpoint a does not hold: NotFound.
	if _, err := b.client.EnsureImage(ctx, a.peer(), "ck-none"); !errdefs.IsNotFound(err) {
		t.Errorf("EnsureImage of a checkpoint the sender lacks: got %v, want NotFound", err)
	}
	// A client whose certificate no node published gets no blob.
	stranger, _, err := NewIdentity("b")
	if err != nil {
		t.Fatal(err)
	}
	sc := &http.Client{Transport: &http.Transport{TLSClientConfig: clientTLS(stranger, pinned)}}
	if resp, err := sc.Get("https://" + a.addr + blobs + img.Digest); err == nil {
		resp.Body.Close()
		t.Errorf("GET with an unknown client certificate: got %s, want the handshake refused", resp.Status)
	}
}
