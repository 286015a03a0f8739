package image

import (
	"context"
	"fmt"
	"io"

	"github.com/forkbox/forkbox/errdefs"
)

// Limits bound what one image may make the store read, write and keep. Every
// byte of an image comes from outside (a registry, an archive), so each
// dimension an image can grow in has a bound; crossing one is a
// ResourceExhausted error that names the limit, and whatever the image had
// unpacked so far is removed. A zero field takes its default (DefaultLimits).
type Limits struct {
	// LayerBytes bounds one layer: its uncompressed tar stream, and
	// separately the file data it writes (a sparse tar entry can write more
	// than the stream holds).
	LayerBytes int64
	// ImageBytes bounds the sum of LayerBytes' measures over an image's
	// layers, counting layers the store already holds.
	ImageBytes int64
	// LayerEntries bounds the tar entries (headers) of one layer, and of
	// an imported archive.
	LayerEntries int
	// Layers bounds the layers of one image.
	Layers int
	// PathBytes bounds a layer entry's name and link target (Linux's
	// PATH_MAX is 4096). Longer names are InvalidArgument, as are path
	// components longer than 255 bytes.
	PathBytes int
	// ManifestBytes bounds one manifest or index document: a registry's
	// manifests, an OCI layout's index.json and manifest blobs, a docker
	// archive's manifest.json.
	ManifestBytes int64
	// ConfigBytes bounds an image's config document.
	ConfigBytes int64
}

// DefaultLimits are the limits of a store opened without WithLimits. They are
// well above any image in common use (the largest public CUDA/ML images have
// layers of a few GiB and fewer than 100 layers) and well below what fills a
// host's state filesystem by surprise.
var DefaultLimits = Limits{
	LayerBytes:    10 << 30,
	ImageBytes:    20 << 30,
	LayerEntries:  1 << 20,
	Layers:        128,
	PathBytes:     4096,
	ManifestBytes: 4 << 20,
	ConfigBytes:   8 << 20,
}

// withDefaults fills zero fields from DefaultLimits.
func (l Limits) withDefaults() Limits {
	d := DefaultLimits
	if l.LayerBytes <= 0 {
		l.LayerBytes = d.LayerBytes
	}
	if l.ImageBytes <= 0 {
		l.ImageBytes = d.ImageBytes
	}
	if l.LayerEntries <= 0 {
		l.LayerEntries = d.LayerEntries
	}
	if l.Layers <= 0 {
		l.Layers = d.Layers
	}
	if l.PathBytes <= 0 {
		l.PathBytes = d.PathBytes
	}
	if l.ManifestBytes <= 0 {
		l.ManifestBytes = d.ManifestBytes
	}
	if l.ConfigBytes <= 0 {
		l.ConfigBytes = d.ConfigBytes
	}
	return l
}

// Option configures a Store at Open.
type Option func(*Store)

// WithLimits sets the store's limits; zero fields keep their defaults.
func WithLimits(l Limits) Option {
	return func(s *Store) { s.limits = l.withDefaults() }
}

// exhausted is the error for a crossed limit.
func exhausted(what string, limit int64) error {
	return fmt.Errorf("%s exceeds the image store's limit of %d: %w", what, limit, errdefs.ErrResourceExhausted)
}

// limitReader passes at most n bytes of r and fails with a ResourceExhausted
// error (naming what) on the first byte past them. It also stops when ctx
// ends, so a slow stream cannot outlive its caller.
type limitReader struct {
	ctx  context.Context
	r    io.Reader
	n    int64 // bytes left
	max  int64
	what string
}

func newLimitReader(ctx context.Context, r io.Reader, max int64, what string) *limitReader {
	return &limitReader{ctx: ctx, r: r, n: max, max: max, what: what}
}

func (l *limitReader) Read(p []byte) (int, error) {
	if err := l.ctx.Err(); err != nil {
		return 0, err
	}
	if l.n < 0 {
		return 0, exhausted(l.what, l.max)
	}
	// Read one byte more than allowed, to tell "exactly at the limit" from
	// "over it".
	if int64(len(p)) > l.n+1 {
		p = p[:l.n+1]
	}
	n, err := l.r.Read(p)
	l.n -= int64(n)
	if l.n < 0 {
		return n + int(l.n), exhausted(l.what, l.max)
	}
	return n, err
}

// readAllLimited reads r to its end, failing with ResourceExhausted past max.
func readAllLimited(ctx context.Context, r io.Reader, max int64, what string) ([]byte, error) {
	return io.ReadAll(newLimitReader(ctx, r, max, what))
}
