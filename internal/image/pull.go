package image

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync/atomic"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"

	"github.com/forkbox/forkbox/errdefs"
)

// platform is the one a multi-platform index is resolved to.
var platform = v1.Platform{OS: "linux", Architecture: runtime.GOARCH}

// Pull fetches ref from its registry and stores it. insecure allows plain
// HTTP (loopback registries use HTTP anyway).
func (s *Store) Pull(ctx context.Context, ref string, insecure bool, progress func(Progress)) (Image, error) {
	var opts []name.Option
	if insecure {
		opts = append(opts, name.Insecure)
	}
	r, err := name.ParseReference(ref, opts...)
	if err != nil {
		return Image{}, fmt.Errorf("image reference %q: %v: %w", ref, err, errdefs.ErrInvalidArgument)
	}
	report(progress, Progress{Phase: "resolve"})
	// Manifests and indexes are read through a transport that bounds them;
	// the config and layers are bounded by their descriptors (store).
	tr := &manifestLimit{base: remote.DefaultTransport, max: s.limits.ManifestBytes}
	desc, err := remote.Get(r, remote.WithContext(ctx), remote.WithPlatform(platform), remote.WithTransport(tr))
	if err != nil {
		return Image{}, tr.classify(ref, err)
	}
	img, err := desc.Image()
	if err != nil {
		return Image{}, tr.classify(ref, err)
	}
	s.log.InfoContext(ctx, "pulling image", "image", r.Name(), "digest", desc.Digest.String())
	out, err := s.store(ctx, r.Name(), img, false, nil, progress, replace)
	if err != nil && !isClassified(err) {
		err = tr.classify(ref, err)
	}
	return out, err
}

// manifestLimit is an HTTP transport that fails a manifest response larger
// than max bytes, and remembers that it did (the registry client does not
// keep our error's class).
type manifestLimit struct {
	base http.RoundTripper
	max  int64
	hit  atomic.Bool
}

func (t *manifestLimit) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.base.RoundTrip(req)
	if err != nil || req.Method != http.MethodGet || !strings.Contains(req.URL.Path, "/manifests/") {
		return resp, err
	}
	if resp.ContentLength > t.max {
		resp.Body.Close()
		t.hit.Store(true)
		return nil, exhausted("manifest", t.max)
	}
	resp.Body = &limitedBody{Reader: newLimitReader(req.Context(), resp.Body, t.max, "manifest"), c: resp.Body, hit: &t.hit}
	return resp, nil
}

type limitedBody struct {
	io.Reader
	c   io.Closer
	hit *atomic.Bool
}

func (b *limitedBody) Read(p []byte) (int, error) {
	n, err := b.Reader.Read(p)
	if errdefs.IsResourceExhausted(err) {
		b.hit.Store(true)
	}
	return n, err
}

func (b *limitedBody) Close() error { return b.c.Close() }

// classify is classifyRemote, but for a manifest over the limit.
func (t *manifestLimit) classify(ref string, err error) error {
	if t.hit.Load() {
		return fmt.Errorf("pull %s: %w", ref, exhausted("manifest", t.max))
	}
	return classifyRemote(ref, err)
}

// classifyRemote gives a registry error its class.
func classifyRemote(ref string, err error) error {
	if errors.Is(err, context.Canceled) {
		return fmt.Errorf("pull %s: %v: %w", ref, err, errdefs.ErrCanceled)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("pull %s: %v: %w", ref, err, errdefs.ErrDeadlineExceeded)
	}
	var te *transport.Error
	if errors.As(err, &te) {
		switch te.StatusCode {
		case http.StatusNotFound:
			return fmt.Errorf("pull %s: %v: %w", ref, err, errdefs.ErrNotFound)
		case http.StatusUnauthorized:
			return fmt.Errorf("pull %s: %v: %w", ref, err, errdefs.ErrUnauthenticated)
		case http.StatusForbidden:
			return fmt.Errorf("pull %s: %v: %w", ref, err, errdefs.ErrPermissionDenied)
		}
		for _, d := range te.Errors {
			switch d.Code {
			case transport.ManifestUnknownErrorCode, transport.NameUnknownErrorCode, transport.BlobUnknownErrorCode:
				return fmt.Errorf("pull %s: %v: %w", ref, err, errdefs.ErrNotFound)
			}
		}
		return fmt.Errorf("pull %s: %v: %w", ref, err, errdefs.ErrUnavailable)
	}
	var ne net.Error
	if errors.As(err, &ne) || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("pull %s: %v: %w", ref, err, errdefs.ErrUnavailable)
	}
	if strings.Contains(err.Error(), "no child with platform") {
		return fmt.Errorf("pull %s: no image for %s/%s: %w", ref, platform.OS, platform.Architecture, errdefs.ErrNotFound)
	}
	return fmt.Errorf("pull %s: %v: %w", ref, err, errdefs.ErrUnavailable)
}

func isClassified(err error) bool { return errdefs.Class(err) != errdefs.ErrUnknown }

func report(progress func(Progress), p Progress) {
	if progress != nil {
		progress(p)
	}
}
