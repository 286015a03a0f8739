package transfer

import (
	"context"
	"fmt"
	"io"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/image"
)

// ImageStore is Images over a node's image store, with its checkpoints'
// images looked up by Checkpoint.
type ImageStore struct {
	Store *image.Store
	// Checkpoint returns the image reference and manifest digest of
	// checkpoint id (from the node's ledger).
	Checkpoint func(ctx context.Context, id string) (ref, digest string, err error)
}

func (s ImageStore) CheckpointImage(ctx context.Context, id string) (string, string, error) {
	ref, digest, err := s.Checkpoint(ctx, id)
	if err != nil {
		return "", "", err
	}
	if digest == "" {
		return "", "", fmt.Errorf("checkpoint %s records no image digest: %w", id, errdefs.ErrFailedPrecondition)
	}
	return ref, digest, nil
}

func (s ImageStore) OpenBlob(ctx context.Context, image, digest string) (io.ReadCloser, int64, error) {
	f, n, err := s.Store.OpenImageBlob(ctx, image, digest)
	if err != nil {
		return nil, 0, err
	}
	return f, n, nil
}

func (s ImageStore) HasImage(ctx context.Context, digest string) bool {
	img, err := s.Store.Get(ctx, digest)
	return err == nil && img.Digest == digest
}

func (s ImageStore) ImportFrom(ctx context.Context, ref, digest string, fetch func(context.Context, string) (io.ReadCloser, error)) error {
	_, err := s.Store.ImportFrom(ctx, ref, digest, fetch, nil)
	return err
}
