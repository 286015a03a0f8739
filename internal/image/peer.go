package image

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"sync"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/forkbox/forkbox/errdefs"
)

// FetchFunc opens blob digest at a peer (another node's OpenBlob, through
// package transfer). What it returns is untrusted: ImportFrom bounds and
// verifies every byte of it.
type FetchFunc func(ctx context.Context, digest string) (io.ReadCloser, error)

// ImportFrom stores the image whose manifest has the given digest, reading
// its manifest, config and layer blobs through fetch, as another node
// keeps them. It is a pull from a registry that is not trusted either:
// the manifest must have the digest asked for, be an image manifest and
// within the store's limits, and then the image goes through the same
// checks, limits and unpacking as any pull (store); a layer already here
// is not fetched. What a refused image unpacked or kept is removed.
//
// The image is stored only as ref's repository@digest, never under a tag:
// the peer picks both ref and digest, so a tag it names would let it plant
// its image under a name that sandboxes here resolve by (checkpoints'
// children mount their image by digest). A ref whose own digest differs
// from digest is refused (InvalidArgument). The record is added only if
// that name is free: a concurrent pull of the same name is kept. An image
// of that digest held already is returned as it is.
func (s *Store) ImportFrom(ctx context.Context, ref, digest string, fetch FetchFunc, progress func(Progress)) (_ Image, err error) {
	if !validDiffID(digest) {
		return Image{}, fmt.Errorf("manifest digest %q: want sha256:<64 lowercase hex>: %w", digest, errdefs.ErrInvalidArgument)
	}
	n, err := peerName(ref, digest)
	if err != nil {
		return Image{}, err
	}
	s.mu.Lock()
	for _, r := range s.images {
		if r.Digest == digest {
			s.mu.Unlock()
			return s.toImage(r), nil
		}
	}
	s.mu.Unlock()
	defer func() {
		if err != nil {
			s.mu.Lock()
			s.gcLocked(context.WithoutCancel(ctx))
			s.mu.Unlock()
			if !isClassified(err) {
				err = fmt.Errorf("import %s from a peer: %v: %w", digest, err, errdefs.ErrUnavailable)
			}
		}
	}()
	report(progress, Progress{Phase: "resolve"})
	raw, err := fetchAll(ctx, fetch, digest, s.limits.ManifestBytes, "image manifest")
	if err != nil {
		return Image{}, err
	}
	h, err := v1.NewHash(digest)
	if err != nil {
		return Image{}, fmt.Errorf("manifest digest %q: %v: %w", digest, err, errdefs.ErrInvalidArgument)
	}
	if err := checkDigest(raw, h, int64(len(raw))); err != nil {
		return Image{}, fmt.Errorf("image manifest: %w", err)
	}
	m, err := v1.ParseManifest(bytes.NewReader(raw))
	if err != nil {
		return Image{}, fmt.Errorf("image manifest: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	switch m.MediaType {
	case "", types.OCIManifestSchema1, types.DockerManifestSchema2:
	default:
		return Image{}, fmt.Errorf("image manifest of media type %q: not an image manifest: %w", m.MediaType, errdefs.ErrInvalidArgument)
	}
	if m.SchemaVersion != 2 {
		return Image{}, fmt.Errorf("image manifest of schema version %d: %w", m.SchemaVersion, errdefs.ErrInvalidArgument)
	}
	if err := checkBlobDescriptors(m, s.limits); err != nil {
		return Image{}, err
	}
	core := &peerImage{ctx: ctx, raw: raw, m: m, fetch: fetch, maxConfig: s.limits.ConfigBytes}
	img, err := partial.CompressedToImage(core)
	if err != nil {
		return Image{}, fmt.Errorf("image from peer: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	s.log.InfoContext(ctx, "importing image from a peer", "image", n, "digest", digest)
	got, err := s.store(ctx, n, img, false, nil, progress, addIfAbsent)
	if err == nil && got.Digest != digest {
		// Taken meanwhile by a pull of that name: it stays.
		return Image{}, fmt.Errorf("image name %s was taken by image %s while %s was imported: %w", n, got.Digest, digest, errdefs.ErrAlreadyExists)
	}
	return got, err
}

// peerName is the name a peer's image ref of manifest digest is stored
// under: ref's repository@digest.
func peerName(ref, digest string) (string, error) {
	r, err := name.ParseReference(ref)
	if err != nil {
		return "", fmt.Errorf("image reference %q: %v: %w", ref, err, errdefs.ErrInvalidArgument)
	}
	if d, ok := r.(name.Digest); ok && d.DigestStr() != digest {
		return "", fmt.Errorf("image reference %q names digest %s, not the %s imported: %w", ref, d.DigestStr(), digest, errdefs.ErrInvalidArgument)
	}
	return r.Context().Digest(digest).Name(), nil
}

// fetchAll reads all of blob digest, at most max bytes.
func fetchAll(ctx context.Context, fetch FetchFunc, digest string, max int64, what string) ([]byte, error) {
	rc, err := fetch(ctx, digest)
	if err != nil {
		return nil, fmt.Errorf("fetch %s: %w", what, err)
	}
	defer rc.Close()
	b, err := readAllLimited(ctx, rc, max, what)
	if err != nil {
		return nil, readErr("fetch "+what, err)
	}
	return b, nil
}

// peerImage is a partial.CompressedImageCore over a peer's blobs: the
// manifest checked by ImportFrom, the config and layers fetched when
// store reads them (and checked there).
type peerImage struct {
	ctx       context.Context
	raw       []byte
	m         *v1.Manifest
	fetch     FetchFunc
	maxConfig int64

	once   sync.Once
	cfg    []byte
	cfgErr error
}

func (p *peerImage) RawManifest() ([]byte, error) { return p.raw, nil }

func (p *peerImage) MediaType() (types.MediaType, error) {
	if p.m.MediaType == "" {
		return types.OCIManifestSchema1, nil
	}
	return p.m.MediaType, nil
}

// RawConfigFile fetches the config once; store checks it against the
// manifest's descriptor.
func (p *peerImage) RawConfigFile() ([]byte, error) {
	p.once.Do(func() {
		p.cfg, p.cfgErr = fetchAll(p.ctx, p.fetch, p.m.Config.Digest.String(), p.maxConfig, "image config")
	})
	return p.cfg, p.cfgErr
}

func (p *peerImage) LayerByDigest(h v1.Hash) (partial.CompressedLayer, error) {
	for i, d := range p.m.Layers {
		if d.Digest == h {
			return peerLayer{p: p, d: d, i: i}, nil
		}
	}
	return nil, fmt.Errorf("blob %s is not a layer of the manifest: %w", h, errdefs.ErrInvalidArgument)
}

// peerLayer is one layer blob at the peer, opened when read; store bounds
// it by its descriptor's size and checks its digest.
type peerLayer struct {
	p *peerImage
	d v1.Descriptor
	i int // in the manifest
}

// DiffID is the config's (unpacking checks the tar stream against it),
// so that learning it needs no fetch of the blob.
func (l peerLayer) DiffID() (v1.Hash, error) {
	raw, err := l.p.RawConfigFile()
	if err != nil {
		return v1.Hash{}, err
	}
	cf, err := v1.ParseConfigFile(bytes.NewReader(raw))
	if err != nil {
		return v1.Hash{}, fmt.Errorf("image config: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	if l.i >= len(cf.RootFS.DiffIDs) {
		return v1.Hash{}, fmt.Errorf("image config lists %d diff IDs for %d layers: %w", len(cf.RootFS.DiffIDs), len(l.p.m.Layers), errdefs.ErrInvalidArgument)
	}
	return cf.RootFS.DiffIDs[l.i], nil
}

func (l peerLayer) Digest() (v1.Hash, error)            { return l.d.Digest, nil }
func (l peerLayer) Size() (int64, error)                { return l.d.Size, nil }
func (l peerLayer) MediaType() (types.MediaType, error) { return l.d.MediaType, nil }
func (l peerLayer) Compressed() (io.ReadCloser, error) {
	rc, err := l.p.fetch(l.p.ctx, l.d.Digest.String())
	if err != nil {
		return nil, fmt.Errorf("fetch layer blob %s: %w", l.d.Digest, err)
	}
	return rc, nil
}
