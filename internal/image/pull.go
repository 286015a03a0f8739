package image

import (
	"bufio"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"runtime"
	"strings"
	"sync/atomic"
	"time"

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
	desc, err := remote.Get(r, remote.WithContext(ctx), remote.WithPlatform(platform))
	if err != nil {
		return Image{}, classifyRemote(ref, err)
	}
	img, err := desc.Image()
	if err != nil {
		return Image{}, classifyRemote(ref, err)
	}
	s.log.InfoContext(ctx, "pulling image", "image", r.Name(), "digest", desc.Digest.String())
	out, err := s.store(ctx, r.Name(), img, false, nil, progress)
	if err != nil && !isClassified(err) {
		err = classifyRemote(ref, err)
	}
	return out, err
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

// store unpacks img's layers (each once) and records it under name.
// uncompressed says the layers' Uncompressed stream is cheap and their
// compressed size unknown (docker-archive); sizes then gives the total.
func (s *Store) store(ctx context.Context, name string, img v1.Image, uncompressed bool, sizes []int64, progress func(Progress)) (Image, error) {
	cf, err := img.ConfigFile()
	if err != nil {
		return Image{}, fmt.Errorf("image config: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	digest, err := img.Digest()
	if err != nil {
		return Image{}, fmt.Errorf("image digest: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	layers, err := img.Layers()
	if err != nil {
		return Image{}, fmt.Errorf("image layers: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	diffIDs := make([]string, len(layers))
	for i, l := range layers {
		h, err := l.DiffID()
		if err != nil {
			return Image{}, fmt.Errorf("layer %d diff ID: %v: %w", i, err, errdefs.ErrInvalidArgument)
		}
		if h.Algorithm != "sha256" || len(h.Hex) != 64 {
			return Image{}, fmt.Errorf("layer %d: unsupported diff ID %q: %w", i, h, errdefs.ErrInvalidArgument)
		}
		diffIDs[i] = h.String()
	}
	defer s.pin(diffIDs)()

	var total int64
	if uncompressed {
		for _, n := range sizes {
			total += n
		}
	} else if m, err := img.Manifest(); err == nil {
		for _, l := range m.Layers {
			total += l.Size
		}
	}
	var done atomic.Int64
	tick := func(n int64) { report(progress, Progress{Phase: "download+unpack", Done: done.Add(n), Total: total}) }
	tick(0)

	var size int64
	for i, l := range layers {
		n, err := s.ensureLayer(ctx, diffIDs[i], l, uncompressed, tick)
		if err != nil {
			return Image{}, err
		}
		size += n
	}
	rec := record{
		Name:    name,
		Digest:  digest.String(),
		Size:    size,
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
	if err := s.add(rec); err != nil {
		return Image{}, err
	}
	report(progress, Progress{Phase: "done", Done: done.Load(), Total: total})
	s.log.InfoContext(ctx, "image stored", "image", name, "digest", rec.Digest, "layers", len(diffIDs))
	return s.toImage(rec), nil
}

// ensureLayer unpacks layer l unless it is there already; it returns the
// uncompressed size of the layer's tar stream.
func (s *Store) ensureLayer(ctx context.Context, diffID string, l v1.Layer, uncompressed bool, tick func(int64)) (int64, error) {
	defer s.lockLayer(diffID)()
	dir := s.layerDir(diffID)
	if b, err := os.ReadFile(dir + ".diffid"); err == nil {
		if _, err := os.Stat(dir); err == nil {
			if got, _, _ := strings.Cut(string(b), " "); got != diffID {
				return 0, fmt.Errorf("layer dir %s holds %s, not %s: %w", dir, got, diffID, errdefs.ErrInternal)
			}
			var n int64
			fmt.Sscan(strings.TrimPrefix(string(b), diffID+" "), &n)
			if sz, err := l.Size(); err == nil && !uncompressed {
				tick(sz)
			}
			return n, nil
		}
	}
	rc, err := openLayer(l, uncompressed, tick)
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
	cr := &countReader{r: io.TeeReader(rc, h)}
	if err := unpackTar(ctx, cr, tmp); err != nil {
		if ne := (net.Error)(nil); errors.As(cr.err, &ne) {
			return 0, fmt.Errorf("fetch layer %s: %v: %w", diffID, cr.err, errdefs.ErrUnavailable)
		}
		return 0, err
	}
	// Read to the end so the digest covers the whole stream (tar padding).
	if _, err := io.Copy(io.Discard, cr); err != nil {
		return 0, fmt.Errorf("read layer %s: %v: %w", diffID, err, errdefs.ErrInvalidArgument)
	}
	if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); got != diffID {
		return 0, fmt.Errorf("layer content digest %s does not match diff ID %s: %w", got, diffID, errdefs.ErrInvalidArgument)
	}
	if err := writeFileAtomic(dir+".diffid", fmt.Appendf(nil, "%s %d", diffID, cr.n)); err != nil {
		return 0, fmt.Errorf("write layer id: %v: %w", err, errdefs.ErrInternal)
	}
	if err := os.Rename(tmp, dir); err != nil && !errors.Is(err, fs.ErrExist) {
		return 0, fmt.Errorf("move layer into place: %v: %w", err, errdefs.ErrInternal)
	}
	ok = true
	s.log.DebugContext(ctx, "layer unpacked", "layer", diffID, "dir", dir, "bytes", cr.n)
	return cr.n, nil
}

// openLayer returns the uncompressed tar stream of l, reporting blob bytes
// read through tick.
func openLayer(l v1.Layer, uncompressed bool, tick func(int64)) (io.ReadCloser, error) {
	if uncompressed {
		rc, err := l.Uncompressed()
		if err != nil {
			return nil, fmt.Errorf("open layer: %v: %w", err, errdefs.ErrInvalidArgument)
		}
		return readCloser{&tickReader{r: rc, tick: tick}, rc}, nil
	}
	rc, err := l.Compressed()
	if err != nil {
		return nil, fmt.Errorf("open layer: %w", err)
	}
	br := bufio.NewReaderSize(&tickReader{r: rc, tick: tick}, 64<<10)
	magic, _ := br.Peek(4)
	switch {
	case len(magic) >= 2 && magic[0] == 0x1f && magic[1] == 0x8b:
		zr, err := gzip.NewReader(br)
		if err != nil {
			rc.Close()
			return nil, fmt.Errorf("gunzip layer: %v: %w", err, errdefs.ErrInvalidArgument)
		}
		return readCloser{zr, rc}, nil
	case len(magic) == 4 && magic[0] == 0x28 && magic[1] == 0xb5 && magic[2] == 0x2f && magic[3] == 0xfd:
		// zstd: let go-containerregistry decompress it (no byte progress).
		rc.Close()
		urc, err := l.Uncompressed()
		if err != nil {
			return nil, fmt.Errorf("open layer: %w", err)
		}
		return urc, nil
	default:
		return readCloser{br, rc}, nil // uncompressed blob
	}
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
