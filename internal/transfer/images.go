package transfer

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/forkbox/forkbox/errdefs"
)

// Images. A checkpoint holds only its sandbox's writes; its children
// mount the image underneath. So before a node pulls a checkpoint it
// makes sure it has that image (Client.EnsureImage): it asks the sender
// which image (reference and manifest digest) the checkpoint runs and,
// unless it holds that digest, fetches the image's manifest, config and
// layer blobs from the sender by digest over the same pinned mutual TLS
// channel, and imports them through its image store (Images.ImportFrom),
// which verifies every byte against the digest asked for and applies the
// same limits and unpacking as any pull. The sender answers both only for
// a checkpoint the peer may pull (Grants, as for the pull itself), and
// serves only blobs of that checkpoint's image, named by a checked digest
// (Images.OpenBlob).
//
//	POST /v1/image                          {"checkpoint": ID} → {"ref": ..., "digest": ...}
//	GET  /v1/checkpoints/{id}/blobs/{digest} the blob's bytes (Content-Length set)
//
// Errors are a JSON remoteError with an HTTP status for the class.

// Images is a node's image store as transfers use it.
type Images interface {
	// CheckpointImage returns the reference and manifest digest of the
	// image checkpoint id's sandbox runs (sender).
	CheckpointImage(ctx context.Context, id string) (ref, digest string, err error)
	// OpenBlob opens blob digest (its manifest, config or a layer) of the
	// image of manifest digest image, which the node holds; NotFound for
	// anything else (sender).
	OpenBlob(ctx context.Context, image, digest string) (io.ReadCloser, int64, error)
	// HasImage reports whether the node holds the image of manifest
	// digest (receiver).
	HasImage(ctx context.Context, digest string) bool
	// ImportFrom stores image ref of manifest digest from blobs read
	// through fetch, which are untrusted: it verifies and bounds them,
	// and leaves nothing of a refused image (receiver).
	ImportFrom(ctx context.Context, ref, digest string, fetch func(ctx context.Context, digest string) (io.ReadCloser, error)) error
}

// imageRequest asks which image a checkpoint runs.
type imageRequest struct {
	Checkpoint string `json:"checkpoint"`
}

type imageAnswer struct {
	Ref    string `json:"ref"`
	Digest string `json:"digest"`
}

// maxRef bounds an image reference in an answer.
const maxRef = 1024

// imageRoutes adds the image endpoints to mux. They have their own
// slots, so images never wait for checkpoints; a request takes one only
// once its peer is identified and granted the checkpoint named.
func (s *Server) imageRoutes(mux *http.ServeMux) {
	limit := func(h func(http.ResponseWriter, *http.Request, string, string)) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			if s.o.Local.Images == nil {
				httpError(w, fmt.Errorf("node serves no images: %w", errdefs.ErrFailedPrecondition))
				return
			}
			peer, err := s.peerOf(r)
			if err != nil {
				httpError(w, err)
				return
			}
			checkpoint := r.PathValue("checkpoint")
			if checkpoint == "" {
				var req imageRequest
				if err := readBody(w, r, s.o.BodyTimeout, &req); err != nil {
					httpError(w, err)
					return
				}
				checkpoint = req.Checkpoint
			}
			ctx, cancel := context.WithTimeout(r.Context(), grantTimeout)
			err = s.grant(ctx, peer, checkpoint)
			cancel()
			if err != nil {
				httpError(w, err)
				return
			}
			release, err := s.images.take(peer)
			if err != nil {
				httpError(w, fmt.Errorf("image requests: %w", err))
				return
			}
			defer release()
			h(w, r, peer, checkpoint)
		}
	}
	mux.HandleFunc("POST /v1/image", limit(s.image))
	mux.HandleFunc("GET /v1/checkpoints/{checkpoint}/blobs/{digest}", limit(s.blob))
}

// checkpointImage is the image of checkpoint, which the peer was granted
// (imageRoutes), if this node holds it.
func (s *Server) checkpointImage(ctx context.Context, checkpoint string) (ref, digest string, err error) {
	if _, err := s.o.Local.held(ctx, checkpoint); err != nil {
		return "", "", err
	}
	return s.o.Local.Images.CheckpointImage(ctx, checkpoint)
}

func (s *Server) image(w http.ResponseWriter, r *http.Request, _, checkpoint string) {
	ctx, cancel := context.WithTimeout(r.Context(), time.Minute)
	defer cancel()
	// Only the image of a checkpoint this node would send the peer.
	ref, digest, err := s.checkpointImage(ctx, checkpoint)
	if err != nil {
		httpError(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(imageAnswer{Ref: ref, Digest: digest})
}

func (s *Server) blob(w http.ResponseWriter, r *http.Request, _, checkpoint string) {
	ctx, cancel := context.WithTimeout(r.Context(), s.o.Timeout)
	defer cancel()
	digest := r.PathValue("digest")
	_, img, err := s.checkpointImage(ctx, checkpoint)
	var f io.ReadCloser
	var size int64
	if err == nil {
		f, size, err = s.o.Local.Images.OpenBlob(ctx, img, digest)
	}
	if err != nil {
		s.o.Log.DebugContext(ctx, "blob refused", slog.String("digest", truncate(digest, 100)), slog.Any("err", err))
		httpError(w, err)
		return
	}
	defer f.Close()
	// A peer that reads slowly holds its slot no longer than a pull.
	_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(s.o.Timeout))
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", fmt.Sprint(size))
	n, err := io.Copy(w, io.LimitReader(f, size))
	if err != nil || n != size {
		s.o.Log.WarnContext(ctx, "blob send failed", slog.String("digest", digest), slog.Int64("bytes", n), slog.Any("err", err))
	}
}

// httpError answers err as a remoteError, with a status for its class.
func httpError(w http.ResponseWriter, err error) {
	status := http.StatusInternalServerError
	switch {
	case errdefs.IsNotFound(err):
		status = http.StatusNotFound
	case errdefs.IsInvalidArgument(err):
		status = http.StatusBadRequest
	case errdefs.IsPermissionDenied(err), errdefs.IsUnauthenticated(err):
		status = http.StatusForbidden
	case errdefs.IsFailedPrecondition(err):
		status = http.StatusPreconditionFailed
	case errdefs.IsUnavailable(err), errdefs.IsResourceExhausted(err):
		status = http.StatusServiceUnavailable
	}
	b, _ := json.Marshal(remoteError{Class: errdefs.ClassName(err), Message: truncate(err.Error(), 4096)})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// remoteErr turns a non-200 answer into an error of the class it names.
func remoteErr(resp *http.Response) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 8<<10))
	var re remoteError
	if json.Unmarshal(b, &re) != nil || re.Class == "" {
		return fmt.Errorf("%s: %s: %w", resp.Status, truncate(string(bytes.TrimSpace(b)), 1024), errdefs.ErrUnavailable)
	}
	class := errdefs.Class(errdefs.FromClassName(re.Class, ""))
	if class == errdefs.ErrUnknown {
		class = errdefs.ErrUnavailable
	}
	return fmt.Errorf("%s: %s: %w", resp.Status, truncate(re.Message, 1024), class)
}

// ImageResult is what EnsureImage did.
type ImageResult struct {
	Ref, Digest string
	// Fetched says the image was not here and came from the peer; Bytes
	// were read of its blobs (layers already here are not fetched).
	Fetched  bool
	Bytes    int64
	Duration time.Duration
}

// EnsureImage makes sure this node holds the image that checkpoint's
// sandbox runs, as peer names it: held already, it does nothing; otherwise
// it fetches the image's blobs from peer and imports them. Everything read
// is bounded by Limits.MaxBytes and Limits.Timeout, and verified by the
// image store; a refused image leaves nothing here.
func (c *Client) EnsureImage(ctx context.Context, peer Peer, checkpoint string) (ImageResult, error) {
	start := time.Now()
	lim := c.Limits.withDefaults()
	var res ImageResult
	if err := validID(checkpoint); err != nil {
		return res, err
	}
	if c.Local.Images == nil {
		return res, fmt.Errorf("node has no image store for transfers: %w", errdefs.ErrFailedPrecondition)
	}
	pinned, err := CertDER(peer.CertPEM)
	if err != nil {
		return res, fmt.Errorf("node %s: %w", peer.Node, err)
	}
	ctx, cancel := context.WithTimeout(ctx, lim.Timeout)
	defer cancel()
	ctx, watch, stop := withStall(ctx, lim.Idle)
	defer stop()
	tr := &http.Transport{TLSClientConfig: clientTLS(c.Identity, pinned), MaxIdleConnsPerHost: 1,
		ResponseHeaderTimeout: time.Minute, TLSHandshakeTimeout: 30 * time.Second}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr}
	fail := func(err error) (ImageResult, error) {
		res.Duration = time.Since(start)
		return res, fmt.Errorf("image of checkpoint %s from node %s: %w", checkpoint, peer.Node, err)
	}

	body, _ := json.Marshal(imageRequest{Checkpoint: checkpoint})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "https://"+peer.Endpoint+"/v1/image", bytes.NewReader(body))
	if err != nil {
		return fail(fmt.Errorf("endpoint %q: %v: %w", peer.Endpoint, err, errdefs.ErrInvalidArgument))
	}
	resp, err := hc.Do(req)
	if err != nil {
		return fail(netErr(ctx, err))
	}
	var ans imageAnswer
	if resp.StatusCode != http.StatusOK {
		err = remoteErr(resp)
	} else if derr := json.NewDecoder(io.LimitReader(watch(resp.Body), maxRequest)).Decode(&ans); derr != nil {
		err = fmt.Errorf("the answer: %v: %w", derr, errdefs.ErrInvalidArgument)
	}
	resp.Body.Close()
	if err != nil {
		return fail(err)
	}
	if len(ans.Ref) > maxRef || ans.Ref == "" || !validDigest(ans.Digest) {
		return fail(fmt.Errorf("it names image %q of digest %q: %w", truncate(ans.Ref, 100), truncate(ans.Digest, 100), errdefs.ErrInvalidArgument))
	}
	res.Ref, res.Digest = ans.Ref, ans.Digest
	if c.Local.Images.HasImage(ctx, ans.Digest) {
		res.Duration = time.Since(start)
		return res, nil
	}

	var read atomic.Int64
	fetch := func(ctx context.Context, digest string) (io.ReadCloser, error) {
		if !validDigest(digest) {
			return nil, fmt.Errorf("blob digest %q: %w", truncate(digest, 100), errdefs.ErrInvalidArgument)
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+peer.Endpoint+"/v1/checkpoints/"+checkpoint+"/blobs/"+digest, nil)
		if err != nil {
			return nil, fmt.Errorf("blob %s: %v: %w", digest, err, errdefs.ErrInvalidArgument)
		}
		resp, err := hc.Do(req)
		if err != nil {
			return nil, fmt.Errorf("blob %s: %w", digest, netErr(ctx, err))
		}
		if resp.StatusCode != http.StatusOK {
			defer resp.Body.Close()
			return nil, fmt.Errorf("blob %s: %w", digest, remoteErr(resp))
		}
		if left := lim.MaxBytes - read.Load(); resp.ContentLength > left {
			resp.Body.Close()
			return nil, fmt.Errorf("blob %s of %d bytes: the transfer goes past its limit of %d bytes: %w", digest, resp.ContentLength, lim.MaxBytes, errdefs.ErrResourceExhausted)
		}
		return &budgetBody{ctx: ctx, rc: resp.Body, in: watch(resp.Body), read: &read, max: lim.MaxBytes}, nil
	}
	err = c.Local.Images.ImportFrom(ctx, ans.Ref, ans.Digest, fetch)
	res.Bytes = read.Load()
	res.Duration = time.Since(start)
	if err != nil {
		return fail(err)
	}
	res.Fetched = true
	c.log().InfoContext(ctx, "image received", slog.String("image", ans.Ref), slog.String("digest", ans.Digest), slog.String("peer", peer.Node),
		slog.Int64("bytes", res.Bytes), slog.Duration("took", res.Duration))
	return res, nil
}

func validDigest(d string) bool {
	h, ok := strings.CutPrefix(d, "sha256:")
	if !ok || len(h) != 64 {
		return false
	}
	for i := 0; i < len(h); i++ {
		if c := h[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// budgetBody counts a blob's bytes against the whole image's budget, and
// gives a stream that stops short the class of a cut transfer.
type budgetBody struct {
	ctx  context.Context
	rc   io.ReadCloser
	in   io.Reader // rc, given up when it stalls
	read *atomic.Int64
	max  int64
}

func (b *budgetBody) Read(p []byte) (int, error) {
	n, err := b.in.Read(p)
	if b.read.Add(int64(n)) > b.max {
		return n, fmt.Errorf("the transfer goes past its limit of %d bytes: %w", b.max, errdefs.ErrResourceExhausted)
	}
	if err != nil && !errors.Is(err, io.EOF) && errdefs.Class(err) == errdefs.ErrUnknown {
		err = netErr(b.ctx, err)
	}
	return n, err
}

// netErr classes an error of the channel: the transfer's time ran out,
// it was canceled, or the peer or the network failed.
func netErr(ctx context.Context, err error) error {
	switch {
	case stalled(ctx) != nil:
		return fmt.Errorf("%w (%v)", stalled(ctx), err)
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		return fmt.Errorf("the transfer took longer than allowed: %v: %w", err, errdefs.ErrDeadlineExceeded)
	case ctx.Err() != nil:
		return fmt.Errorf("the transfer was canceled: %v: %w", err, errdefs.ErrCanceled)
	}
	return fmt.Errorf("the stream was cut: %v: %w", err, errdefs.ErrUnavailable)
}

func (b *budgetBody) Close() error { return b.rc.Close() }
