package image

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"net"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/forkbox/forkbox/errdefs"
)

// store unpacks img's layers (each once) and records it under name.
// uncompressed says the layers' Uncompressed stream is cheap and their
// compressed size unknown (docker-archive); sizes then gives the total.
//
// Before anything is unpacked, the manifest, the number of layers and the
// config are checked against the store's limits, and the config against
// its digest in the manifest. A layer's blob is checked against its
// manifest digest and size, and its tar stream against its diff ID. When
// an image is refused as invalid or over a limit, the layers it unpacked
// and nothing else references are deleted.
//
// Unless uncompressed, the manifest, config and layer blobs are kept as
// read (blobs.go) once each matched its digest. mode says whether the
// record replaces one of that name (a pull, an import) or is added only
// if the name is free (a peer's import: what holds the name is returned).
func (s *Store) store(ctx context.Context, name string, img v1.Image, uncompressed bool, sizes []int64, progress func(Progress), mode addMode) (_ Image, err error) {
	lim := s.limits
	var m *v1.Manifest
	var raw []byte
	if !uncompressed {
		raw, err = img.RawManifest()
		if err != nil {
			return Image{}, readErr("image manifest", err)
		}
		if int64(len(raw)) > lim.ManifestBytes {
			return Image{}, exhausted("image manifest", lim.ManifestBytes)
		}
		if m, err = img.Manifest(); err != nil {
			return Image{}, readErr("image manifest", err)
		}
		if len(m.Layers) > lim.Layers {
			return Image{}, exhausted(fmt.Sprintf("image's %d layers", len(m.Layers)), int64(lim.Layers))
		}
		if m.Config.Size > lim.ConfigBytes {
			return Image{}, exhausted("image config", lim.ConfigBytes)
		}
		if err := checkBlobDescriptors(m, lim); err != nil {
			return Image{}, err
		}
	}
	rawCf, err := img.RawConfigFile()
	if err != nil {
		return Image{}, readErr("image config", err)
	}
	if int64(len(rawCf)) > lim.ConfigBytes {
		return Image{}, exhausted("image config", lim.ConfigBytes)
	}
	if m != nil {
		if err := checkDigest(rawCf, m.Config.Digest, m.Config.Size); err != nil {
			return Image{}, fmt.Errorf("image config: %w", err)
		}
	}
	cf, err := v1.ParseConfigFile(bytes.NewReader(rawCf))
	if err != nil {
		return Image{}, fmt.Errorf("image config: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	digest, err := img.Digest()
	if err != nil {
		return Image{}, readErr("image digest", err)
	}
	layers, err := img.Layers()
	if err != nil {
		return Image{}, readErr("image layers", err)
	}
	if len(layers) > lim.Layers {
		return Image{}, exhausted(fmt.Sprintf("image's %d layers", len(layers)), int64(lim.Layers))
	}
	diffIDs := make([]string, len(layers))
	for i, l := range layers {
		h, err := l.DiffID()
		if err != nil {
			return Image{}, fmt.Errorf("layer %d diff ID: %v: %w", i, err, errdefs.ErrInvalidArgument)
		}
		if !validDiffID(h.String()) {
			return Image{}, fmt.Errorf("layer %d: unsupported diff ID %q: %w", i, h, errdefs.ErrInvalidArgument)
		}
		diffIDs[i] = h.String()
	}
	// Some sources derive diff IDs from the blobs (an uncompressed layer's
	// digest is its diff ID): the config must say the same.
	if len(cf.RootFS.DiffIDs) != len(diffIDs) {
		return Image{}, fmt.Errorf("image config lists %d diff IDs for %d layers: %w", len(cf.RootFS.DiffIDs), len(diffIDs), errdefs.ErrInvalidArgument)
	}
	for i, h := range cf.RootFS.DiffIDs {
		if h.String() != diffIDs[i] {
			return Image{}, fmt.Errorf("layer %d: config's diff ID %s, layer's %s: %w", i, h, diffIDs[i], errdefs.ErrInvalidArgument)
		}
	}
	var blobs []string
	if m != nil {
		blobs = append(blobs, m.Config.Digest.String())
		for _, l := range m.Layers {
			blobs = append(blobs, l.Digest.String())
		}
	}
	unpin := s.pin(append(append(slices.Clone(diffIDs), blobs...), digest.String()))
	defer func() {
		unpin()
		if errdefs.IsInvalidArgument(err) || errdefs.IsResourceExhausted(err) {
			s.mu.Lock()
			s.gcLocked(ctx)
			s.mu.Unlock()
		}
	}()

	var total int64
	if uncompressed {
		for _, n := range sizes {
			total += n
		}
	} else {
		for _, l := range m.Layers {
			total += l.Size
		}
	}
	var done atomic.Int64
	tick := func(n int64) { report(progress, Progress{Phase: "download+unpack", Done: done.Add(n), Total: total}) }
	tick(0)

	var size int64
	for i, l := range layers {
		b := budget{max: lim.LayerBytes, what: "layer"}
		if left := lim.ImageBytes - size; left < b.max {
			b = budget{max: left, what: "image's layers in total"}
		}
		n, err := s.ensureLayer(ctx, diffIDs[i], l, uncompressed, tick, b)
		if err != nil {
			return Image{}, err
		}
		if size += n; size > lim.ImageBytes {
			return Image{}, exhausted("image's layers in total", lim.ImageBytes)
		}
	}
	if m != nil {
		if err := s.keepBytes(digest.String(), raw, "image manifest"); err != nil {
			return Image{}, err
		}
		if err := s.keepBytes(m.Config.Digest.String(), rawCf, "image config"); err != nil {
			return Image{}, err
		}
	}
	rec := record{
		Name:    name,
		Digest:  digest.String(),
		Size:    size,
		Blobs:   blobs,
		DiffIDs: diffIDs,
		Created: time.Now().UTC(),
		Config: Config{
			Env:        cf.Config.Env,
			Entrypoint: cf.Config.Entrypoint,
			Cmd:        cf.Config.Cmd,
			WorkingDir: cf.Config.WorkingDir,
			User:       cf.Config.User,
		},
	}
	if rec, err = s.add(rec, mode); err != nil {
		return Image{}, err
	}
	report(progress, Progress{Phase: "done", Done: done.Load(), Total: total})
	s.log.InfoContext(ctx, "image stored", "image", name, "digest", rec.Digest, "layers", len(diffIDs))
	return s.toImage(rec), nil
}

// checkDigest is an InvalidArgument error unless b has the given sha256
// digest and size.
func checkDigest(b []byte, want v1.Hash, size int64) error {
	sum := sha256.Sum256(b)
	if want.Algorithm != "sha256" || want.Hex != hex.EncodeToString(sum[:]) || int64(len(b)) != size {
		return fmt.Errorf("content (%d bytes, sha256:%x) does not match its descriptor (%d bytes, %s): %w",
			len(b), sum, size, want, errdefs.ErrInvalidArgument)
	}
	return nil
}

// budget is how many bytes one layer may take, and which limit that is.
type budget struct {
	max  int64
	what string
}

// ensureLayer unpacks layer l unless it is there already; it returns the
// uncompressed size of the layer's tar stream.
func (s *Store) ensureLayer(ctx context.Context, diffID string, l v1.Layer, uncompressed bool, tick func(int64), b budget) (int64, error) {
	defer s.lockLayer(diffID)()
	dir := s.layerDir(diffID)
	if rec, err := os.ReadFile(dir + ".diffid"); err == nil {
		if _, err := os.Stat(dir); err == nil {
			if got, _, _ := strings.Cut(string(rec), " "); got != diffID {
				return 0, fmt.Errorf("layer dir %s holds %s, not %s: %w", dir, got, diffID, errdefs.ErrInternal)
			}
			var n int64
			fmt.Sscan(strings.TrimPrefix(string(rec), diffID+" "), &n)
			if !uncompressed {
				if err := s.ensureLayerBlob(ctx, l, diffID); err != nil {
					return 0, err
				}
				if sz, err := l.Size(); err == nil {
					tick(sz)
				}
			}
			return n, nil
		}
	}
	if b.max <= 0 {
		return 0, exhausted(b.what, b.max)
	}
	var keep *blobFile
	if !uncompressed {
		d, err := l.Digest()
		if err != nil {
			return 0, readErr("layer digest", err)
		}
		if keep, err = s.newBlobFile(d.String()); err != nil {
			return 0, err
		}
		defer func() {
			if keep != nil {
				keep.abort()
			}
		}()
	}
	rc, blob, err := openLayer(l, uncompressed, tick, keep)
	if err != nil {
		return 0, err
	}
	defer rc.Close()
	tmp, err := os.MkdirTemp(s.tmpDir(), "unpack-")
	if err != nil {
		return 0, fmt.Errorf("temp dir: %v: %w", err, errdefs.ErrInternal)
	}
	ok := false
	defer func() {
		if !ok {
			removeAll(tmp)
		}
	}()
	if err := os.Chmod(tmp, 0o755); err != nil {
		return 0, fmt.Errorf("chmod: %v: %w", err, errdefs.ErrInternal)
	}
	h := sha256.New()
	cr := &countReader{r: io.TeeReader(newLimitReader(ctx, rc, b.max, b.what), h)}
	lim := layerLimits{bytes: b.max, what: b.what, entries: s.limits.LayerEntries, path: s.limits.PathBytes}
	if err := unpackTar(ctx, cr, tmp, lim); err != nil {
		if ne := (net.Error)(nil); errors.As(cr.err, &ne) {
			return 0, fmt.Errorf("fetch layer %s: %v: %w", diffID, cr.err, errdefs.ErrUnavailable)
		}
		return 0, fmt.Errorf("layer %s: %w", diffID, err)
	}
	// Read to the end so the digests cover the whole stream (tar padding,
	// and whatever follows the tar in the blob).
	if _, err := io.Copy(io.Discard, cr); err != nil {
		return 0, readErr("read layer "+diffID, err)
	}
	if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); got != diffID {
		return 0, fmt.Errorf("layer content digest %s does not match diff ID %s: %w", got, diffID, errdefs.ErrInvalidArgument)
	}
	if blob != nil {
		if err := blob.check(l); err != nil {
			return 0, fmt.Errorf("layer %s: %w", diffID, err)
		}
		err := keep.commit()
		keep = nil
		if err != nil {
			return 0, err
		}
	}
	if err := writeFileAtomic(dir+".diffid", fmt.Appendf(nil, "%s %d", diffID, cr.n)); err != nil {
		return 0, fmt.Errorf("write layer id: %v: %w", err, errdefs.ErrInternal)
	}
	if err := os.Rename(tmp, dir); err != nil && !errors.Is(err, fs.ErrExist) {
		return 0, fmt.Errorf("move layer into place: %v: %w", err, errdefs.ErrInternal)
	}
	ok = true
	removeAll(tmp) // still there if another process won the rename
	s.log.DebugContext(ctx, "layer unpacked", "layer", diffID, "dir", dir, "bytes", cr.n)
	return cr.n, nil
}

// openLayer returns the uncompressed tar stream of l, reporting blob bytes
// read through tick. For a compressed blob it also returns the blob reader,
// which checks the blob's digest and size once drained, and copies the
// blob to keep as it passes.
func openLayer(l v1.Layer, uncompressed bool, tick func(int64), keep io.Writer) (io.ReadCloser, *blobReader, error) {
	if uncompressed {
		rc, err := l.Uncompressed()
		if err != nil {
			return nil, nil, fmt.Errorf("open layer: %v: %w", err, errdefs.ErrInvalidArgument)
		}
		return readCloser{&tickReader{r: rc, tick: tick}, rc}, nil, nil
	}
	size, err := l.Size()
	if err != nil {
		return nil, nil, readErr("layer size", err)
	}
	rc, err := l.Compressed()
	if err != nil {
		return nil, nil, fmt.Errorf("open layer: %w", err)
	}
	blob := &blobReader{rc: rc, tick: &tickReader{r: rc, tick: tick}, h: sha256.New(), keep: keep, size: size}
	// gzip, zstd or plain tar, told by its first bytes.
	ul, err := partial.CompressedToLayer(compressedBlob{l, blob})
	if err == nil {
		var urc io.ReadCloser
		if urc, err = ul.Uncompressed(); err == nil {
			return urc, blob, nil // closing urc closes blob
		}
	}
	rc.Close()
	return nil, nil, fmt.Errorf("decompress layer: %v: %w", err, errdefs.ErrInvalidArgument)
}

// compressedBlob is a partial.CompressedLayer whose Compressed stream is
// blob (read once). It has no Uncompressed method of its own, so partial
// decompresses blob.
type compressedBlob struct {
	l    v1.Layer
	blob *blobReader
}

func (c compressedBlob) Digest() (v1.Hash, error)            { return c.l.Digest() }
func (c compressedBlob) Size() (int64, error)                { return c.l.Size() }
func (c compressedBlob) MediaType() (types.MediaType, error) { return c.l.MediaType() }
func (c compressedBlob) Compressed() (io.ReadCloser, error)  { return c.blob, nil }

// blobReader reads a layer's blob, hashing, counting and keeping it; a
// blob longer than its descriptor's size is refused at the first byte
// past it.
type blobReader struct {
	rc   io.Closer
	tick *tickReader
	h    hash.Hash
	n    int64
	keep io.Writer
	size int64
}

func (b *blobReader) Read(p []byte) (int, error) {
	if int64(len(p)) > b.size-b.n+1 {
		p = p[:b.size-b.n+1]
	}
	n, err := b.tick.Read(p)
	b.h.Write(p[:n])
	if b.n += int64(n); b.n > b.size {
		return n, fmt.Errorf("layer blob is longer than its %d bytes: %w", b.size, errdefs.ErrInvalidArgument)
	}
	if b.keep != nil && n > 0 {
		if _, werr := b.keep.Write(p[:n]); werr != nil {
			return n, fmt.Errorf("keep layer blob: %v: %w", werr, errdefs.ErrInternal)
		}
	}
	return n, err
}

func (b *blobReader) Close() error { return b.rc.Close() }

// check drains the blob and compares it with l's digest and size.
func (b *blobReader) check(l v1.Layer) error {
	if _, err := io.Copy(io.Discard, b); err != nil {
		return readErr("read layer blob", err)
	}
	want, err := l.Digest()
	if err != nil {
		return readErr("layer digest", err)
	}
	size, err := l.Size()
	if err != nil {
		return readErr("layer size", err)
	}
	got := v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(b.h.Sum(nil))}
	if got != want || b.n != size {
		return fmt.Errorf("blob (%d bytes, %s) does not match the manifest (%d bytes, %s): %w", b.n, got, size, want, errdefs.ErrInvalidArgument)
	}
	return nil
}

type readCloser struct {
	io.Reader
	c io.Closer
}

func (r readCloser) Close() error { return r.c.Close() }

type countReader struct {
	r   io.Reader
	n   int64
	err error // first error other than io.EOF
}

func (c *countReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	if err != nil && err != io.EOF && c.err == nil {
		c.err = err
	}
	return n, err
}

type tickReader struct {
	r    io.Reader
	tick func(int64)
	acc  int64
}

func (t *tickReader) Read(p []byte) (int, error) {
	n, err := t.r.Read(p)
	t.acc += int64(n)
	if t.acc >= 1<<20 || (err != nil && t.acc > 0) {
		t.tick(t.acc)
		t.acc = 0
	}
	return n, err
}
