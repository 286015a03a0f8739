package client

import (
	"context"

	"connectrpc.com/connect"

	v1 "github.com/forkbox/forkbox/api/forkbox/v1"
	"github.com/forkbox/forkbox/errdefs/errconnect"
)

// Image is an image in the daemon's store.
type Image = v1.Image

// Progress is one progress update of a pull or import.
type Progress = v1.ImageProgress

type progressStream interface {
	Receive() bool
	Msg() *v1.ImageProgress
	Err() error
	Close() error
}

func drain(s progressStream, progress func(*Progress)) (*Image, error) {
	defer s.Close()
	var img *Image
	for s.Receive() {
		m := s.Msg()
		if m.Image != nil {
			img = m.Image
		}
		if progress != nil {
			progress(m)
		}
	}
	if err := s.Err(); err != nil {
		return nil, errconnect.FromConnect(err)
	}
	return img, nil
}

// PullImage pulls an image from a registry; progress may be nil.
func (c *Client) PullImage(ctx context.Context, ref string, insecure bool, progress func(*Progress)) (*Image, error) {
	c.init()
	s, err := c.images.PullImage(ctx, connect.NewRequest(&v1.PullImageRequest{Ref: ref, Insecure: insecure}))
	if err != nil {
		return nil, errconnect.FromConnect(err)
	}
	return drain(s, progress)
}

// ImportImage imports an oci-archive or docker-archive at an absolute path
// on the daemon's host.
func (c *Client) ImportImage(ctx context.Context, path, name string, progress func(*Progress)) (*Image, error) {
	c.init()
	s, err := c.images.ImportImage(ctx, connect.NewRequest(&v1.ImportImageRequest{Path: path, Name: name}))
	if err != nil {
		return nil, errconnect.FromConnect(err)
	}
	return drain(s, progress)
}

// ImportImageArchive imports an oci-archive or docker-archive sent in
// the request (any caller, over TCP too; a gateway imports it on every
// ready node). The server bounds its request (32 MiB): larger images go
// through a registry.
func (c *Client) ImportImageArchive(ctx context.Context, archive []byte, name string, progress func(*Progress)) (*Image, error) {
	c.init()
	s, err := c.images.ImportImage(ctx, connect.NewRequest(&v1.ImportImageRequest{Archive: archive, Name: name}))
	if err != nil {
		return nil, errconnect.FromConnect(err)
	}
	return drain(s, progress)
}

// ListImages lists the daemon's images.
func (c *Client) ListImages(ctx context.Context) ([]*Image, error) {
	c.init()
	resp, err := c.images.ListImages(ctx, connect.NewRequest(&v1.ListImagesRequest{}))
	if err != nil {
		return nil, errconnect.FromConnect(err)
	}
	return resp.Msg.Images, nil
}

// RemoveImage removes an image no live sandbox uses.
func (c *Client) RemoveImage(ctx context.Context, name string) error {
	c.init()
	_, err := c.images.RemoveImage(ctx, connect.NewRequest(&v1.RemoveImageRequest{Name: name}))
	return errconnect.FromConnect(err)
}
