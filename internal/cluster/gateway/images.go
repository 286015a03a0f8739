package gateway

import (
	"context"
	"fmt"
	"slices"

	"connectrpc.com/connect"

	v1 "github.com/forkbox/forkbox/api/forkbox/v1"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/errdefs/errconnect"
	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
	"github.com/forkbox/forkbox/internal/cluster/kube"
)

// images is the ImageService. Images are per node: an import, a pull or
// a removal is done on every Ready node in turn (so that a create on any
// of them finds the image), their progress forwarded, and the first node
// that fails ends the call with an error naming it (the nodes before it
// have the change). A node that joins later lacks what was imported
// before it joined: import again, or pull from a registry (a sandbox
// asking for the image there fails NotFound, as on one host; a node
// fetches a checkpoint's image from a peer by digest only when it
// receives that checkpoint, internal/transfer).
type images struct{ g *Gateway }

// MaxArchiveBytes bounds an archive sent to ImportImage: what fits, with
// the rest of the request, in one request to a node (the daemon's
// MaxRequestBytes, as the gateway's).
const MaxArchiveBytes = MaxRequestBytes - 1<<20

// readyNode is a Ready node and its API address.
type readyNode struct{ name, endpoint string }

// readyNodes are the nodes that are Ready with a usable endpoint, by name,
// as the API server has them: an import is rare and heavy, and a node that
// has just come back Ready (which the cache may not show yet) must get the
// image too.
func (g *Gateway) readyNodes(ctx context.Context) ([]readyNode, error) {
	var l fbv1.ForkboxNodeList
	if err := g.api.List(ctx, &l); err != nil {
		return nil, kerr(err, "list nodes")
	}
	var out []readyNode
	for _, n := range l.Items {
		if !kube.IsTrue(n.Status.Conditions, fbv1.ConditionReady) || !n.DeletionTimestamp.IsZero() {
			continue
		}
		ep, err := g.endpoint(ctx, n.Name)
		if err != nil {
			continue
		}
		out = append(out, readyNode{n.Name, ep})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no node is ready: %w", errdefs.ErrUnavailable)
	}
	slices.SortFunc(out, func(a, b readyNode) int {
		if a.name < b.name {
			return -1
		}
		return 1
	})
	return out, nil
}

// onNode wraps a node's error with its name, keeping its class.
func onNode(what, node string, err error) error {
	err = errconnect.FromConnect(err)
	class := errdefs.Class(err)
	if class == errdefs.ErrUnknown {
		class = errdefs.ErrUnavailable
	}
	return fmt.Errorf("%s on node %s: %v: %w", what, node, err, class)
}

// everyNode streams one image call to each ready node, forwarding its
// progress, and answers with the last node's image.
func (g *Gateway) everyNode(ctx context.Context, what string, stream *connect.ServerStream[v1.ImageProgress],
	call func(ctx context.Context, n readyNode) (*connect.ServerStreamForClient[v1.ImageProgress], error)) error {
	nodes, err := g.readyNodes(ctx)
	if err != nil {
		return err
	}
	var img *v1.Image
	for _, n := range nodes {
		s, err := call(ctx, n)
		if err != nil {
			return onNode(what, n.name, err)
		}
		for s.Receive() {
			p := s.Msg()
			if p.Image != nil {
				img = p.Image
				continue
			}
			if err := stream.Send(p); err != nil {
				s.Close()
				return err
			}
		}
		err = s.Err()
		s.Close()
		if err != nil {
			return onNode(what, n.name, err)
		}
	}
	if img == nil {
		return fmt.Errorf("%s: no node answered with the image: %w", what, errdefs.ErrInternal)
	}
	return stream.Send(&v1.ImageProgress{Phase: "done", Image: img})
}

// ImportImage imports the archive the caller sends on every ready node,
// keeping what a name holds already (KeepExisting): the nodes' images are
// shared by every tenant, so an import never replaces an image another
// runs; the same image again is fine. A path names a file on some host:
// the gateway reads none (as a daemon reads none for a remote caller).
func (i *images) ImportImage(ctx context.Context, req *connect.Request[v1.ImportImageRequest], stream *connect.ServerStream[v1.ImageProgress]) error {
	m := req.Msg
	if m.Path != "" {
		return fmt.Errorf("ImportImage of a path: the gateway reads no host's files; send the archive itself (the SDKs: importImage(bytes)) or push the image to a registry and pull it: %w", errdefs.ErrPermissionDenied)
	}
	if len(m.Archive) == 0 {
		return fmt.Errorf("an archive is required: %w", errdefs.ErrInvalidArgument)
	}
	if len(m.Archive) > MaxArchiveBytes {
		return fmt.Errorf("an archive of %d bytes: at most %d through the gateway (larger images: push to a registry and pull): %w", len(m.Archive), MaxArchiveBytes, errdefs.ErrResourceExhausted)
	}
	return i.g.everyNode(ctx, "import", stream, func(ctx context.Context, n readyNode) (*connect.ServerStreamForClient[v1.ImageProgress], error) {
		return i.g.nodes.images(n.endpoint).ImportImage(ctx, connect.NewRequest(&v1.ImportImageRequest{Archive: m.Archive, Name: m.Name, KeepExisting: true}))
	})
}

// PullImage pulls on every ready node.
func (i *images) PullImage(ctx context.Context, req *connect.Request[v1.PullImageRequest], stream *connect.ServerStream[v1.ImageProgress]) error {
	m := req.Msg
	if m.Ref == "" || len(m.Ref) > 1024 {
		return fmt.Errorf("an image reference of 1 to 1024 bytes is required: %w", errdefs.ErrInvalidArgument)
	}
	if m.Insecure {
		// Plain HTTP to any address from every node: not a tenant's to ask.
		return fmt.Errorf("an insecure pull through the gateway: a cluster admin pulls from a plain-HTTP registry on the nodes' own API: %w", errdefs.ErrPermissionDenied)
	}
	return i.g.everyNode(ctx, "pull", stream, func(ctx context.Context, n readyNode) (*connect.ServerStreamForClient[v1.ImageProgress], error) {
		return i.g.nodes.images(n.endpoint).PullImage(ctx, connect.NewRequest(&v1.PullImageRequest{Ref: m.Ref, Insecure: m.Insecure}))
	})
}

// RemoveImage is refused: the nodes' images are shared by every tenant
// of the cluster, so one tenant's remove would break the others'
// sandboxes; a cluster admin removes images on the nodes' own API.
func (i *images) RemoveImage(context.Context, *connect.Request[v1.RemoveImageRequest]) (*connect.Response[v1.RemoveImageResponse], error) {
	return nil, fmt.Errorf("RemoveImage through the gateway: the nodes' images are shared by every tenant of the cluster; a cluster admin removes them on each node's API (forkbox image rm against the node): %w", errdefs.ErrPermissionDenied)
}

// ListImages lists the images the nodes report cached (status.images),
// each once.
func (i *images) ListImages(ctx context.Context, _ *connect.Request[v1.ListImagesRequest]) (*connect.Response[v1.ListImagesResponse], error) {
	var l fbv1.ForkboxNodeList
	if err := i.g.c.List(ctx, &l); err != nil {
		return nil, kerr(err, "list nodes")
	}
	var names []string
	for _, n := range l.Items {
		names = append(names, n.Status.Images...)
	}
	slices.Sort(names)
	out := &v1.ListImagesResponse{}
	for _, n := range slices.Compact(names) {
		out.Images = append(out.Images, &v1.Image{Name: n})
	}
	return connect.NewResponse(out), nil
}
