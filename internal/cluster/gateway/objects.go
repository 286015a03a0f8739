package gateway

import (
	"context"
	"errors"
	"fmt"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/forkbox/forkbox/errdefs"
	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
)

// maxRef bounds a sandbox or checkpoint reference a caller sends.
const maxRef = 253

// kerr gives an error of the API server its class.
func kerr(err error, what string) error {
	if err == nil {
		return nil
	}
	var class error
	switch {
	case apierrors.IsNotFound(err):
		class = errdefs.ErrNotFound
	case apierrors.IsAlreadyExists(err):
		class = errdefs.ErrAlreadyExists
	case apierrors.IsInvalid(err), apierrors.IsBadRequest(err):
		class = errdefs.ErrInvalidArgument
	case apierrors.IsForbidden(err):
		class = errdefs.ErrPermissionDenied
	case apierrors.IsConflict(err):
		class = errdefs.ErrFailedPrecondition
	case errors.Is(err, context.DeadlineExceeded):
		class = errdefs.ErrDeadlineExceeded
	case errors.Is(err, context.Canceled):
		class = errdefs.ErrCanceled
	default:
		class = errdefs.ErrUnavailable
	}
	return fmt.Errorf("%s: %v: %w", what, err, class)
}

// validName checks a name a caller gives before it becomes an object's
// name: a DNS label (children and checkpoints append to it), and not of
// the form of an ID, which would make references ambiguous.
func validName(kind, name string) error {
	if errs := validation.IsDNS1123Label(name); len(errs) > 0 {
		return fmt.Errorf("%s name %q: %s (cluster mode: names are Kubernetes object names): %w", kind, name, strings.Join(errs, "; "), errdefs.ErrInvalidArgument)
	}
	if len(name) > 50 {
		return fmt.Errorf("%s name %q: at most 50 characters in cluster mode: %w", kind, name, errdefs.ErrInvalidArgument)
	}
	if strings.HasPrefix(name, "sb-") || strings.HasPrefix(name, "ck-") {
		return fmt.Errorf("%s name %q: sb- and ck- start IDs: %w", kind, name, errdefs.ErrInvalidArgument)
	}
	return nil
}

func checkRef(kind, ref string) error {
	if ref == "" {
		return fmt.Errorf("a %s ID or name is required: %w", kind, errdefs.ErrInvalidArgument)
	}
	if len(ref) > maxRef {
		return fmt.Errorf("%s reference of %d bytes: at most %d: %w", kind, len(ref), maxRef, errdefs.ErrInvalidArgument)
	}
	return nil
}

// sandbox finds the Sandbox of the gateway's namespace that ref names:
// its local ID (the ID callers see) or its object name.
func (g *Gateway) sandbox(ctx context.Context, ref string) (*fbv1.Sandbox, error) {
	if err := checkRef("sandbox", ref); err != nil {
		return nil, err
	}
	if strings.HasPrefix(ref, "sb-") {
		var l fbv1.SandboxList
		if err := g.c.List(ctx, &l, client.InNamespace(g.o.Namespace), client.MatchingFields{localIDField: ref}); err != nil {
			return nil, kerr(err, "list sandboxes")
		}
		if len(l.Items) == 1 {
			return &l.Items[0], nil
		}
		if len(l.Items) > 1 {
			return nil, fmt.Errorf("sandbox %q: %d objects hold that local ID: %w", ref, len(l.Items), errdefs.ErrFailedPrecondition)
		}
		return nil, fmt.Errorf("sandbox %q: %w", ref, errdefs.ErrNotFound)
	}
	var sb fbv1.Sandbox
	key := types.NamespacedName{Namespace: g.o.Namespace, Name: ref}
	err := g.c.Get(ctx, key, &sb)
	if apierrors.IsNotFound(err) {
		err = g.api.Get(ctx, key, &sb) // one the cache has not seen yet
	}
	if err != nil {
		if apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("sandbox %q: %w", ref, errdefs.ErrNotFound)
		}
		return nil, kerr(err, "sandbox "+ref)
	}
	return &sb, nil
}

// checkpoint finds the Checkpoint that ref names: a holder's local ID
// (the ID callers see) or its object name.
func (g *Gateway) checkpoint(ctx context.Context, ref string) (*fbv1.Checkpoint, error) {
	if err := checkRef("checkpoint", ref); err != nil {
		return nil, err
	}
	if strings.HasPrefix(ref, "ck-") {
		var l fbv1.CheckpointList
		if err := g.c.List(ctx, &l, client.InNamespace(g.o.Namespace), client.MatchingFields{replicaIDField: ref}); err != nil {
			return nil, kerr(err, "list checkpoints")
		}
		if len(l.Items) == 1 {
			return &l.Items[0], nil
		}
		return nil, fmt.Errorf("checkpoint %q: %w", ref, errdefs.ErrNotFound)
	}
	var ck fbv1.Checkpoint
	key := types.NamespacedName{Namespace: g.o.Namespace, Name: ref}
	err := g.c.Get(ctx, key, &ck)
	if apierrors.IsNotFound(err) {
		err = g.api.Get(ctx, key, &ck) // one the cache has not seen yet
	}
	if err != nil {
		if apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("checkpoint %q: %w", ref, errdefs.ErrNotFound)
		}
		return nil, kerr(err, "checkpoint "+ref)
	}
	return &ck, nil
}

// await calls cond at once and again after every change the cache sees,
// until it reports done or an error, or the caller's deadline (capped at
// MaxWait) passes: then the error says what cond last saw.
func (g *Gateway) await(ctx context.Context, what string, cond func() (done bool, status string, err error)) error {
	ctx, cancel := context.WithTimeout(ctx, g.o.MaxWait)
	defer cancel()
	for {
		changed := g.changed.wait()
		done, status, err := cond()
		if err != nil || done {
			return err
		}
		select {
		case <-changed:
		case <-ctx.Done():
			class := errdefs.ErrDeadlineExceeded
			if errors.Is(ctx.Err(), context.Canceled) {
				class = errdefs.ErrCanceled
			}
			return fmt.Errorf("waiting for %s: %s: %w", what, status, class)
		}
	}
}

// getFresh reads obj from the cache; a NotFound is reported as gone.
func (g *Gateway) getFresh(ctx context.Context, obj client.Object) (gone bool, err error) {
	err = g.c.Get(ctx, client.ObjectKeyFromObject(obj), obj)
	if apierrors.IsNotFound(err) {
		// The cache may not have seen an object just made: the API
		// server has the last word on gone.
		err = g.api.Get(ctx, client.ObjectKeyFromObject(obj), obj)
		if apierrors.IsNotFound(err) {
			return true, nil
		}
	}
	return false, kerr(err, "get "+obj.GetName())
}

// reread replaces sb with the API server's copy (getFresh reads the cache
// first).
func (g *Gateway) reread(ctx context.Context, sb *fbv1.Sandbox) error {
	return kerr(g.api.Get(ctx, client.ObjectKeyFromObject(sb), sb), "read sandbox "+sb.Name)
}

// editSpec changes sb with edit against the API server's copy, locked on
// its version and retried on a conflict (two calls must not undo each
// other); sb is left as written.
func (g *Gateway) editSpec(ctx context.Context, sb *fbv1.Sandbox, edit func(*fbv1.Sandbox) error) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := g.api.Get(ctx, client.ObjectKeyFromObject(sb), sb); err != nil {
			return err
		}
		before := sb.DeepCopy()
		if err := edit(sb); err != nil {
			return err
		}
		return g.c.Patch(ctx, sb, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{}))
	})
}
