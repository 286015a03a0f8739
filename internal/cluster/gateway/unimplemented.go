package gateway

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"time"

	"connectrpc.com/connect"

	v1 "github.com/forkbox/forkbox/api/forkbox/v1"
	"github.com/forkbox/forkbox/api/forkbox/v1/forkboxv1connect"
	"github.com/forkbox/forkbox/errdefs"
	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
)

// unimplemented is the answer of a call that has no cluster meaning yet:
// never a silent success.
func unimplemented(call, instead string) error {
	return fmt.Errorf("%s is not available in cluster mode (forkbox serve --gateway): %s: %w", call, instead, errdefs.ErrNotImplemented)
}

func (s *sandboxes) SetCredential(context.Context, *connect.Request[v1.SetCredentialRequest]) (*connect.Response[v1.SetCredentialResponse], error) {
	return nil, unimplemented("SetCredential", "credentials come from Secrets: name one in the Sandbox object's spec.credentials")
}

func (s *sandboxes) DeleteCredential(context.Context, *connect.Request[v1.DeleteCredentialRequest]) (*connect.Response[v1.DeleteCredentialResponse], error) {
	return nil, unimplemented("DeleteCredential", "credentials come from Secrets: remove it from the Sandbox object's spec.credentials")
}

// images is the ImageService: images are per node, so only the list (of
// what the nodes report cached) has a cluster meaning.
type images struct{ g *Gateway }

func (i *images) PullImage(context.Context, *connect.Request[v1.PullImageRequest], *connect.ServerStream[v1.ImageProgress]) error {
	return unimplemented("PullImage", "images are per node: a cluster admin pulls on the nodes (forkbox image pull against each node)")
}

func (i *images) ImportImage(context.Context, *connect.Request[v1.ImportImageRequest], *connect.ServerStream[v1.ImageProgress]) error {
	return unimplemented("ImportImage", "images are per node: a cluster admin imports on the nodes (forkbox image import against each node)")
}

func (i *images) RemoveImage(context.Context, *connect.Request[v1.RemoveImageRequest]) (*connect.Response[v1.RemoveImageResponse], error) {
	return nil, unimplemented("RemoveImage", "images are per node: a cluster admin removes them on the nodes")
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

// Every method of the three services is implemented here, with a
// cluster meaning or a clear refusal.
var (
	_ forkboxv1connect.SandboxServiceHandler     = (*sandboxes)(nil)
	_ forkboxv1connect.ImageServiceHandler       = (*images)(nil)
	_ forkboxv1connect.EnvironmentServiceHandler = (*environments)(nil)
)

type streamCtlKey struct{}

// withStreamControl lets the ExecPty handler end a caller's blocked
// Receive once the node's side has ended.
func withStreamControl(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == forkboxv1connect.SandboxServiceExecPtyProcedure {
			r = r.WithContext(context.WithValue(r.Context(), streamCtlKey{}, http.NewResponseController(w)))
		}
		next.ServeHTTP(w, r)
	})
}

// endReceive makes a blocked or later Receive of the caller's stream fail.
func endReceive(ctx context.Context) {
	if rc, ok := ctx.Value(streamCtlKey{}).(*http.ResponseController); ok {
		_ = rc.SetReadDeadline(time.Unix(1, 0))
	}
}
