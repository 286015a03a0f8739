package gateway

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"

	"connectrpc.com/connect"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"

	v1 "github.com/forkbox/forkbox/api/forkbox/v1"
	"github.com/forkbox/forkbox/errdefs"
	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
	"github.com/forkbox/forkbox/internal/cluster/controller"
	"github.com/forkbox/forkbox/internal/cluster/kube"
)

// A client-run setup (an SDK's setup function) on objects: BeginBuild
// defines the Environment with the setup's hash (spec.setupHash), so the
// controller starts a builder Sandbox that no node agent runs steps in;
// the first caller to write its lease on that builder (an update that
// fails for everyone else, whose write comes second) holds it and gets
// it, the others wait until the build ends. CompleteBuild writes the
// client's word on the builder (forkbox.dev/setup-result), and waits
// while the controller captures it (ok) or records the failure. The
// lease a caller holds is "<build>/<token>" (the builder is
// fbv1.BuilderName of the build); a client that never completes is timed
// out by the controller (ClientSetupTimeout).

// maxLease bounds the lease a caller sends back.
const maxLease = 320

// maxSetupError bounds the reason a client gives for a failed setup.
const maxSetupError = 1024

func (s *environments) BeginBuild(ctx context.Context, req *connect.Request[v1.BeginBuildRequest]) (*connect.Response[v1.BeginBuildResponse], error) {
	spec, err := specOf(req.Msg.Definition)
	if err != nil {
		return nil, err
	}
	if spec.SetupHash == "" {
		return nil, fmt.Errorf("BeginBuild is for a client-run setup: setup_hash is required (cluster mode; give server-run setups as steps to BuildEnvironment): %w", errdefs.ErrInvalidArgument)
	}
	name, hash := req.Msg.Definition.Name, spec.Hash()
	for try := 1; ; try++ {
		e, _, err := s.g.define(ctx, name, spec)
		if err != nil {
			return nil, err
		}
		var builder *fbv1.Sandbox
		var lease string
		var failed *metav1.Condition
		w := watchOf(e)
		err = s.g.await(ctx, "a builder of environment "+name, func() (bool, string, error) {
			if done, wait, err := s.g.buildNow(ctx, e, w, name, hash); done || wait != "" || err != nil {
				return done, wait, err
			}
			if failed = failedBuild(e, hash); failed != nil {
				return true, "", nil
			}
			builder, lease, err = s.g.takeBuilder(ctx, e, hash)
			if err != nil || builder != nil {
				return err == nil, "", err
			}
			p, _ := s.g.buildProgress(ctx, e, hash)
			return false, p.Message, nil
		})
		switch {
		case err != nil:
			return nil, err
		case builder != nil:
			out, err := s.g.nodeSandbox(ctx, builder)
			if err != nil {
				return nil, err
			}
			return connect.NewResponse(&v1.BeginBuildResponse{Builder: out, Lease: lease}), nil
		case failed == nil:
			return connect.NewResponse(&v1.BeginBuildResponse{Environment: s.g.envView(ctx, e)}), nil
		case failed.Reason != controller.ReasonSetupFailed || try == 3:
			// Not a client's failed setup (which is the next caller's to
			// try again, as the daemon has it): its builder cannot start.
			return nil, buildError(e, failed)
		}
	}
}

// takeBuilder writes a lease on the running builder of e's build of hash
// unless another caller holds it; it returns the builder and the lease
// once this caller holds it, nil while it waits.
func (g *Gateway) takeBuilder(ctx context.Context, e *fbv1.Environment, hash string) (*fbv1.Sandbox, string, error) {
	build := fbv1.BuildName(e, hash)
	if e.Status.Build != build {
		return nil, "", nil
	}
	var sb fbv1.Sandbox // from the cache: a stale one fails the update below, and the next change brings it
	if err := g.c.Get(ctx, types.NamespacedName{Namespace: e.Namespace, Name: fbv1.BuilderName(build)}, &sb); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, "", nil
		}
		return nil, "", kerr(err, "builder "+fbv1.BuilderName(build))
	}
	if !metav1.IsControlledBy(&sb, e) || !sb.DeletionTimestamp.IsZero() {
		return nil, "", nil // of an earlier environment of this name, going
	}
	if sb.Status.Phase != fbv1.PhaseRunning || sb.Status.LocalID == "" {
		if sb.Status.Phase != fbv1.PhaseFailed && sb.Status.Phase != fbv1.PhaseLost {
			if err := startFailure(&sb); err != nil {
				return nil, "", fmt.Errorf("environment %s: %w (the Environment object builds once a node has room)", e.Name, err)
			}
		}
		return nil, "", nil // starting, or failed (the controller fails the build)
	}
	if sb.Annotations[fbv1.LeaseAnnotation] != "" || sb.Annotations[fbv1.SetupResultAnnotation] != "" {
		return nil, "", nil // another caller's
	}
	b := make([]byte, 12)
	rand.Read(b)
	token := "ls-" + hex.EncodeToString(b)
	if sb.Annotations == nil {
		sb.Annotations = map[string]string{}
	}
	sb.Annotations[fbv1.LeaseAnnotation] = token
	if err := g.c.Update(ctx, &sb); err != nil {
		if apierrors.IsConflict(err) {
			return nil, "", nil // changed meanwhile (perhaps taken): look again at the next change
		}
		return nil, "", kerr(err, "take builder "+build)
	}
	g.log.InfoContext(ctx, "build lease taken", "environment", e.Name, "sandbox", sb.Name)
	return &sb, build + "/" + token, nil
}

func (s *environments) CompleteBuild(ctx context.Context, req *connect.Request[v1.CompleteBuildRequest]) (*connect.Response[v1.CompleteBuildResponse], error) {
	m := req.Msg
	build, token, found := strings.Cut(m.Lease, "/")
	if len(m.Lease) > maxLease || !found || build == "" || !strings.HasPrefix(token, "ls-") {
		return nil, fmt.Errorf("build lease %q: not a lease BeginBuild gave: %w", kube.Truncate(m.Lease, 64), errdefs.ErrNotFound)
	}
	result := "ok"
	if !m.Ok {
		why := m.Error
		if why == "" {
			why = "the client's setup failed"
		}
		result = "failed: " + kube.Truncate(why, maxSetupError)
	}
	sb := &fbv1.Sandbox{}
	key := types.NamespacedName{Namespace: s.g.o.Namespace, Name: fbv1.BuilderName(build)}
	notHeld := fmt.Errorf("build lease %q: not held (it ended: completed, timed out, or its builder is gone): %w", kube.Truncate(m.Lease, 64), errdefs.ErrNotFound)
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := s.g.api.Get(ctx, key, sb); err != nil {
			if apierrors.IsNotFound(err) {
				return notHeld
			}
			return kerr(err, "builder "+build)
		}
		if sb.Annotations[fbv1.LeaseAnnotation] != token || sb.Annotations[fbv1.SetupResultAnnotation] != "" || !sb.DeletionTimestamp.IsZero() {
			return notHeld
		}
		sb.Annotations[fbv1.SetupResultAnnotation] = result
		return s.g.c.Update(ctx, sb)
	})
	if err != nil {
		if apierrors.IsConflict(err) {
			return nil, kerr(err, "complete the build of "+build)
		}
		return nil, err
	}
	e, err := s.g.environment(ctx, sb.Labels[fbv1.EnvironmentLabel])
	if err != nil {
		return nil, err
	}
	// Until the controller has captured the builder, or recorded the
	// failure.
	err = s.g.await(ctx, "build "+build+" of environment "+e.Name, func() (bool, string, error) {
		gone, err := s.g.getFresh(ctx, e)
		switch {
		case err != nil:
			return false, "", err
		case gone:
			return false, "", fmt.Errorf("environment %s was deleted while it was building: %w", e.Name, errdefs.ErrNotFound)
		case e.Status.Checkpoint == build:
			return true, "", nil
		}
		c := meta.FindStatusCondition(e.Status.Conditions, fbv1.ConditionBuilt)
		if e.Status.Build != build {
			return false, "", fmt.Errorf("environment %s: build %s was superseded by %s: %w", e.Name, build, e.Status.Build, errdefs.ErrFailedPrecondition)
		}
		if c != nil && c.Status == metav1.ConditionFalse && c.Reason != controller.ReasonBuilding {
			if !m.Ok {
				return false, "", fmt.Errorf("the client's setup failed: %s: %w", kube.Truncate(m.Error, maxSetupError), errdefs.ErrFailedPrecondition)
			}
			return false, "", buildError(e, c)
		}
		msg := ""
		if c != nil {
			msg = c.Message
		}
		return false, msg, nil
	})
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&v1.CompleteBuildResponse{Environment: s.g.envView(ctx, e)}), nil
}
