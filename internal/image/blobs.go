package image

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/forkbox/forkbox/errdefs"
)

// Blobs. Unpacked layers cannot be turned back into the blobs an image's
// manifest names (a tar written again differs byte for byte, and so does
// its gzip), so the store also keeps, for every image pulled from a
// registry or imported from an OCI layout, the blobs exactly as it read
// and verified them:
//
//	b/<64 hex>   one blob (a manifest, a config, a compressed layer),
//	             named by the sha256 of its bytes; staged in tmp/blob-*
//	             while it is read, renamed into place once its digest and
//	             size matched its descriptor
//
// A record lists the blobs it holds (Blobs: config and layers; the
// manifest is its Digest); a blob no record lists is deleted with the last
// image that listed it (gcLocked). That lets another node fetch an image
// by digest (OpenBlob here, ImportFrom there) and verify every byte of it
// against the manifest digest it asked for. Images imported from a docker
// archive keep no blobs (their manifest is computed, not read, and names
// gzip streams no one wrote), nor do images stored before blobs were kept
// until they are pulled or imported again: OpenBlob answers NotFound for
// them.

func (s *Store) blobsDir() string { return filepath.Join(s.root, "b") }

// blobPath is where blob digest ("sha256:<64 hex>", checked by the caller)
// is kept.
func (s *Store) blobPath(digest string) string {
	return filepath.Join(s.blobsDir(), strings.TrimPrefix(digest, "sha256:"))
}

func (s *Store) hasBlob(digest string) bool {
	fi, err := os.Lstat(s.blobPath(digest))
	return err == nil && fi.Mode().IsRegular()
}

// keepBytes keeps b as blob digest; b must have that digest.
func (s *Store) keepBytes(digest string, b []byte, what string) error {
	sum := sha256.Sum256(b)
	if !validDiffID(digest) || "sha256:"+hex.EncodeToString(sum[:]) != digest {
		return fmt.Errorf("%s: content sha256:%x does not match digest %s: %w", what, sum, digest, errdefs.ErrInvalidArgument)
	}
	if s.hasBlob(digest) {
		return nil
	}
	bf, err := s.newBlobFile(digest)
	if err != nil {
		return err
	}
	if _, err := bf.f.Write(b); err != nil {
		bf.abort()
		return fmt.Errorf("keep %s: %v: %w", what, err, errdefs.ErrInternal)
	}
	return bf.commit()
}

// blobFile is a blob being staged in tmp/.
type blobFile struct {
	s      *Store
	f      *os.File
	digest string
}

func (s *Store) newBlobFile(digest string) (*blobFile, error) {
	f, err := os.CreateTemp(s.tmpDir(), "blob-")
	if err != nil {
		return nil, fmt.Errorf("stage blob: %v: %w", err, errdefs.ErrInternal)
	}
	return &blobFile{s: s, f: f, digest: digest}, nil
}

func (b *blobFile) Write(p []byte) (int, error) { return b.f.Write(p) }

// commit moves the staged blob into place; its content was checked by the
// caller.
func (b *blobFile) commit() error {
	err := b.f.Sync()
	if cerr := b.f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(b.f.Name(), b.s.blobPath(b.digest))
	}
	if err != nil {
		os.Remove(b.f.Name())
		return fmt.Errorf("keep blob %s: %v: %w", b.digest, err, errdefs.ErrInternal)
	}
	return nil
}

func (b *blobFile) abort() {
	b.f.Close()
	os.Remove(b.f.Name())
}

// keepLayerBlob reads and keeps the blob of layer l, unpacked before
// blobs were kept: at most its descriptor's size (itself at most max),
// checked against its digest, and its tar stream against diffID (the
// layer unpacked here: a blob kept is served to other nodes as this
// layer), before it goes into place.
func (s *Store) keepLayerBlob(ctx context.Context, l v1.Layer, diffID string, max int64) error {
	want, err := l.Digest()
	if err != nil {
		return readErr("layer digest", err)
	}
	size, err := l.Size()
	if err != nil {
		return readErr("layer size", err)
	}
	if size > max {
		return exhausted("layer blob", max)
	}
	bf, err := s.newBlobFile(want.String())
	if err != nil {
		return err
	}
	keep := false
	defer func() {
		if !keep {
			bf.abort()
		}
	}()
	rc, blob, err := openLayer(l, false, func(int64) {}, bf)
	if err != nil {
		return err
	}
	defer rc.Close()
	h := sha256.New()
	if _, err := io.Copy(h, newLimitReader(ctx, rc, s.limits.LayerBytes, "layer")); err != nil {
		return readErr("read layer blob", err)
	}
	if err := blob.check(l); err != nil {
		return fmt.Errorf("layer blob: %w", err)
	}
	if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); got != diffID {
		return fmt.Errorf("layer blob %s holds a tar stream of digest %s, not the diff ID %s unpacked here: %w", want, got, diffID, errdefs.ErrInvalidArgument)
	}
	keep = true
	return bf.commit()
}

// checkBlobDescriptors refuses a manifest whose config or layers are not
// sha256 blobs, or whose layer blobs are larger than one layer may be
// (a compressed blob is not larger than its tar stream by more than its
// framing), or together larger than an image.
func checkBlobDescriptors(m *v1.Manifest, lim Limits) error {
	if !validDiffID(m.Config.Digest.String()) {
		return fmt.Errorf("image config: unsupported digest %q: %w", m.Config.Digest, errdefs.ErrInvalidArgument)
	}
	var total int64
	for i, l := range m.Layers {
		if !validDiffID(l.Digest.String()) || l.Size < 0 {
			return fmt.Errorf("layer %d: unsupported descriptor (%s, %d bytes): %w", i, l.Digest, l.Size, errdefs.ErrInvalidArgument)
		}
		if l.Size > lim.LayerBytes+lim.LayerBytes/64 {
			return exhausted(fmt.Sprintf("layer %d's blob of %d bytes", i, l.Size), lim.LayerBytes)
		}
		if total += l.Size; total > lim.ImageBytes+lim.ImageBytes/64 {
			return exhausted("image's layer blobs in total", lim.ImageBytes)
		}
	}
	return nil
}

// ensureLayerBlob keeps the blob of a layer unpacked before blobs were
// kept (or by a docker-archive import), so the image can be shipped too.
func (s *Store) ensureLayerBlob(ctx context.Context, l v1.Layer, diffID string) error {
	d, err := l.Digest()
	if err != nil {
		return readErr("layer digest", err)
	}
	if !validDiffID(d.String()) {
		return fmt.Errorf("layer: unsupported digest %q: %w", d, errdefs.ErrInvalidArgument)
	}
	if s.hasBlob(d.String()) {
		return nil
	}
	return s.keepLayerBlob(ctx, l, diffID, s.limits.LayerBytes+s.limits.LayerBytes/64)
}

// OpenImageBlob opens blob digest ("sha256:<64 hex>") of the image of
// manifest digest image, which this store holds, for a peer to read
// (package transfer): its manifest (image itself), its config or one of
// its layer blobs. Anything else, whatever is on disk, is NotFound; a
// digest of another form is InvalidArgument. The path is made of the
// checked digest only, and is opened without following a link.
func (s *Store) OpenImageBlob(_ context.Context, image, digest string) (*os.File, int64, error) {
	if !validDiffID(image) {
		return nil, 0, fmt.Errorf("image digest %q: want sha256:<64 lowercase hex>: %w", image, errdefs.ErrInvalidArgument)
	}
	if !validDiffID(digest) {
		return nil, 0, fmt.Errorf("blob digest %q: want sha256:<64 lowercase hex>: %w", digest, errdefs.ErrInvalidArgument)
	}
	s.mu.Lock()
	held := false
	for _, r := range s.images {
		if r.Digest == image && len(r.Blobs) > 0 && (r.Digest == digest || slices.Contains(r.Blobs, digest)) {
			held = true
			break
		}
	}
	s.mu.Unlock()
	if !held {
		return nil, 0, fmt.Errorf("blob %s: image %s is not held here with it (images from a docker archive, or stored before blobs were kept, have no blobs): %w", digest, image, errdefs.ErrNotFound)
	}
	f, err := os.OpenFile(s.blobPath(digest), os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, 0, fmt.Errorf("blob %s: %w", digest, errdefs.ErrNotFound)
	}
	if err != nil {
		return nil, 0, fmt.Errorf("blob %s: %v: %w", digest, err, errdefs.ErrInternal)
	}
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		f.Close()
		return nil, 0, fmt.Errorf("blob %s is not a regular file: %w", digest, errdefs.ErrInternal)
	}
	return f, fi.Size(), nil
}

// gcBlobsLocked deletes the blobs no image and no import in flight lists.
// s.mu must be held.
func (s *Store) gcBlobsLocked(ctx context.Context) {
	keep := map[string]bool{}
	for _, r := range s.images {
		keep[r.Digest] = true
		for _, b := range r.Blobs {
			keep[b] = true
		}
	}
	for d := range s.pinned {
		keep[d] = true
	}
	ents, err := os.ReadDir(s.blobsDir())
	if err != nil {
		s.log.WarnContext(ctx, "list blobs", "err", err)
		return
	}
	for _, e := range ents {
		if keep["sha256:"+e.Name()] {
			continue
		}
		src := filepath.Join(s.blobsDir(), e.Name())
		tomb := filepath.Join(s.tmpDir(), "rm-b-"+e.Name())
		if err := os.Rename(src, tomb); err != nil {
			s.log.WarnContext(ctx, "tombstone blob", "path", src, "err", err)
			continue
		}
		if err := removeAll(tomb); err != nil {
			s.log.WarnContext(ctx, "delete blob", "path", tomb, "err", err)
		}
	}
}
