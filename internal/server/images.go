package server

import (
	"context"
	"fmt"
	"os"
	"sync"

	"connectrpc.com/connect"

	v1 "github.com/forkbox/forkbox/api/forkbox/v1"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/daemon"
	"github.com/forkbox/forkbox/internal/image"
)

type images struct{ d *daemon.Daemon }

func toImage(img image.Image) *v1.Image {
	return &v1.Image{Name: img.Name, Digest: img.Digest, Size: img.Size, Layers: int32(len(img.Layers)), CreatedAtUnixMs: img.Created.UnixMilli()}
}

// progressSender forwards image progress to the stream, dropping updates
// that come while the previous one is still being sent.
func progressSender(stream *connect.ServerStream[v1.ImageProgress]) func(image.Progress) {
	var mu sync.Mutex
	return func(p image.Progress) {
		if !mu.TryLock() {
			return
		}
		defer mu.Unlock()
		_ = stream.Send(&v1.ImageProgress{Phase: p.Phase, Done: p.Done, Total: p.Total})
	}
}

func (s *images) PullImage(ctx context.Context, req *connect.Request[v1.PullImageRequest], stream *connect.ServerStream[v1.ImageProgress]) error {
	img, err := s.d.PullImage(ctx, req.Msg.Ref, req.Msg.Insecure, progressSender(stream))
	if err != nil {
		return err
	}
	return stream.Send(&v1.ImageProgress{Phase: "done", Image: toImage(img)})
}

func (s *images) ImportImage(ctx context.Context, req *connect.Request[v1.ImportImageRequest], stream *connect.ServerStream[v1.ImageProgress]) error {
	if len(req.Msg.Archive) > 0 {
		if req.Msg.Path != "" {
			return fmt.Errorf("give a path or an archive, not both: %w", errdefs.ErrInvalidArgument)
		}
		// The caller's own bytes (bounded by MaxRequestBytes): any caller.
		img, err := importArchive(ctx, s.d, req.Msg.Archive, req.Msg.Name, req.Msg.KeepExisting, progressSender(stream))
		if err != nil {
			return err
		}
		return stream.Send(&v1.ImageProgress{Phase: "done", Image: toImage(img)})
	}
	if remote(ctx) {
		// The path is read by the daemon, as root, on its host: only local
		// callers may name one.
		return errdefs.FromClassName("PermissionDenied", "ImportImage reads a path on the daemon's host: use the local socket, or push the image to a registry and pull it")
	}
	img, err := s.importPath(ctx, req.Msg.Path, req.Msg.Name, req.Msg.KeepExisting, progressSender(stream))
	if err != nil {
		return err
	}
	return stream.Send(&v1.ImageProgress{Phase: "done", Image: toImage(img)})
}

func (s *images) importPath(ctx context.Context, path, name string, keep bool, progress func(image.Progress)) (image.Image, error) {
	if keep {
		return s.d.ImportImageKeep(ctx, path, name, progress)
	}
	return s.d.ImportImage(ctx, path, name, progress)
}

// importArchive imports an archive sent in a request from a private
// temporary file, removed after.
func importArchive(ctx context.Context, d *daemon.Daemon, archive []byte, name string, keep bool, progress func(image.Progress)) (image.Image, error) {
	f, err := os.CreateTemp("", "forkbox-import-*.tar") // mode 0600
	if err != nil {
		return image.Image{}, fmt.Errorf("import: %v: %w", err, errdefs.ErrInternal)
	}
	defer os.Remove(f.Name())
	_, err = f.Write(archive)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return image.Image{}, fmt.Errorf("import: write the archive: %v: %w", err, errdefs.ErrInternal)
	}
	if keep {
		return d.ImportImageKeep(ctx, f.Name(), name, progress)
	}
	return d.ImportImage(ctx, f.Name(), name, progress)
}

func (s *images) ListImages(ctx context.Context, req *connect.Request[v1.ListImagesRequest]) (*connect.Response[v1.ListImagesResponse], error) {
	list, err := s.d.Images().List(ctx)
	if err != nil {
		return nil, err
	}
	out := &v1.ListImagesResponse{}
	for _, img := range list {
		out.Images = append(out.Images, toImage(img))
	}
	return connect.NewResponse(out), nil
}

func (s *images) RemoveImage(ctx context.Context, req *connect.Request[v1.RemoveImageRequest]) (*connect.Response[v1.RemoveImageResponse], error) {
	if err := s.d.RemoveImage(ctx, req.Msg.Name); err != nil {
		return nil, err
	}
	return connect.NewResponse(&v1.RemoveImageResponse{}), nil
}
