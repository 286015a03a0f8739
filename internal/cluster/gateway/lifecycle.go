package gateway

import (
	"context"
	"fmt"
	"strings"
	"time"

	"connectrpc.com/connect"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/forkbox/forkbox/api/forkbox/v1"
	"github.com/forkbox/forkbox/errdefs"
	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
	"github.com/forkbox/forkbox/internal/cluster/controller"
)

// sandboxes is the gateway's SandboxService.
type sandboxes struct{ g *Gateway }

func (s *sandboxes) CreateSandbox(ctx context.Context, req *connect.Request[v1.CreateSandboxRequest]) (*connect.Response[v1.CreateSandboxResponse], error) {
	m := req.Msg
	start := time.Now()
	if m.Image == "" {
		return nil, fmt.Errorf("an image is required: %w", errdefs.ErrInvalidArgument)
	}
	if len(m.Image) > 1024 {
		return nil, fmt.Errorf("image reference of %d bytes: at most 1024: %w", len(m.Image), errdefs.ErrInvalidArgument)
	}
	if err := noOnTimeout(m.OnTimeout, m.Runtime); err != nil {
		return nil, err
	}
	rt, err := runtimeOf(m.Runtime)
	if err != nil {
		return nil, err
	}
	spec := fbv1.SandboxSpec{Image: m.Image, Runtime: rt, WorkingDir: m.Cwd, State: fbv1.StateRunning}
	if err := fill(&spec, m.Resources, m.Env, m.Egress, m.EgressAllow, m.EgressDeny); err != nil {
		return nil, err
	}
	sb, err := s.g.newSandbox(m.Name, spec)
	if err != nil {
		return nil, err
	}
	out, err := s.g.createAndWait(ctx, sb, m.TimeoutMs)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&v1.CreateSandboxResponse{Sandbox: out, ReadyMs: ms(time.Since(start))}), nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// noOnTimeout refuses what the Sandbox object cannot carry yet, after
// the checks the daemon makes first.
func noOnTimeout(onTimeout, runtime string) error {
	switch onTimeout {
	case "", "close":
		return nil
	case "hibernate":
		if runtime == string(fbv1.RuntimeCrun) {
			return fmt.Errorf("on_timeout hibernate needs the gvisor runtime (crun cannot hibernate): %w", errdefs.ErrInvalidArgument)
		}
		return fmt.Errorf("on_timeout %q: cluster mode has only close (a hibernating timeout is not in the Sandbox object yet; use HibernateSandbox): %w", onTimeout, errdefs.ErrNotImplemented)
	}
	return fmt.Errorf("on_timeout %q: want close or hibernate: %w", onTimeout, errdefs.ErrInvalidArgument)
}

// fill sets what a create or a restore's overrides give.
func fill(spec *fbv1.SandboxSpec, r *v1.Resources, env map[string]string, egress string, allow, deny []string) error {
	var err error
	if spec.Resources, err = resourcesOf(r); err != nil {
		return err
	}
	if spec.Env, err = envList(env); err != nil {
		return err
	}
	if len(spec.WorkingDir) > 4096 {
		return fmt.Errorf("cwd of %d bytes: at most 4096: %w", len(spec.WorkingDir), errdefs.ErrInvalidArgument)
	}
	spec.Egress, err = egressSpec(egress, allow, deny)
	return err
}

// newSandbox is the object of a sandbox named name ("" = generated).
func (g *Gateway) newSandbox(name string, spec fbv1.SandboxSpec) (*fbv1.Sandbox, error) {
	sb := &fbv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: g.o.Namespace}, Spec: spec}
	if name == "" {
		sb.GenerateName = "box-"
	} else {
		if err := validName("sandbox", name); err != nil {
			return nil, err
		}
		sb.Name = name
	}
	return sb, nil
}

// createAndWait creates sb and waits until it runs; a sandbox that
// fails, fits no node or is not running by the deadline is deleted, so
// a failed create leaves nothing (as on one host).
func (g *Gateway) createAndWait(ctx context.Context, sb *fbv1.Sandbox, timeoutMs int64) (*v1.Sandbox, error) {
	if timeoutMs < 0 {
		return nil, fmt.Errorf("timeout_ms %d: %w", timeoutMs, errdefs.ErrInvalidArgument)
	}
	if err := g.create(ctx, sb); err != nil {
		return nil, err
	}
	out, err := g.waitRunning(ctx, sb)
	if err == nil && timeoutMs > 0 {
		r, rerr := g.routeTo(ctx, sb)
		if err = rerr; err == nil {
			var resp *connect.Response[v1.SetTimeoutResponse]
			if resp, err = r.c.SetTimeout(ctx, connect.NewRequest(&v1.SetTimeoutRequest{Sandbox: r.id, TimeoutMs: timeoutMs})); err == nil {
				out = nodeView(resp.Msg.Sandbox, sb)
			}
		}
	}
	if err != nil {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if derr := g.c.Delete(dctx, sb); derr != nil && !apierrors.IsNotFound(derr) {
			g.log.Warn("could not delete the sandbox of a failed create", "sandbox", sb.Name, "err", derr)
		}
		return nil, err
	}
	return out, nil
}

// create creates sb. A name that a closed sandbox's object holds is
// free, as one host frees a closed sandbox's name: that object (the
// record the retention keeps; its node's ledger keeps its own) is
// deleted first.
func (g *Gateway) create(ctx context.Context, sb *fbv1.Sandbox) error {
	err := g.c.Create(ctx, sb)
	if apierrors.IsAlreadyExists(err) && sb.Name != "" {
		var old fbv1.Sandbox
		if gerr := g.api.Get(ctx, client.ObjectKeyFromObject(sb), &old); gerr == nil && old.Closed() {
			g.log.InfoContext(ctx, "name of a closed sandbox taken again: its record goes", "sandbox", old.Name, "local", old.Status.LocalID)
			if err = g.deleteAndWait(ctx, &old); err != nil {
				return err
			}
			err = g.c.Create(ctx, sb)
		}
	}
	return kerr(err, "create sandbox "+sb.Name+sb.GenerateName)
}

// waitRunning waits until sb runs on its node and returns the node's
// view of it.
func (g *Gateway) waitRunning(ctx context.Context, sb *fbv1.Sandbox) (*v1.Sandbox, error) {
	err := g.await(ctx, "sandbox "+sb.Name+" to run", func() (bool, string, error) {
		gone, err := g.getFresh(ctx, sb)
		if err != nil {
			return false, "", err
		}
		if gone {
			return false, "", fmt.Errorf("sandbox %s was deleted while starting: %w", sb.Name, errdefs.ErrNotFound)
		}
		status := fmt.Sprintf("phase %q on node %q: %s", sb.Status.Phase, sb.Spec.NodeName, sb.Status.Message)
		return sb.Status.Phase == fbv1.PhaseRunning && sb.Status.LocalID != "", status, startFailure(sb)
	})
	if err != nil {
		return nil, err
	}
	return g.nodeSandbox(ctx, sb)
}

// startFailure is why a starting sandbox will not run, or nil while it
// may: the placer's refusal (no node fits: ResourceExhausted; the
// checkpoint on no node with room: FailedPrecondition; the one node a
// resumed session may run on is down: Unavailable), the node's Failed, a
// Lost node.
func startFailure(sb *fbv1.Sandbox) error {
	msg := sb.Status.Message
	switch sb.Status.Phase {
	case fbv1.PhaseFailed:
		// The node names the class of a failed create in the reason
		// (CreateFailedNotFound, ...); other failures are the sandbox's state.
		class := errdefs.ErrFailedPrecondition
		if c := meta.FindStatusCondition(sb.Status.Conditions, fbv1.ConditionReady); c != nil {
			if name, ok := strings.CutPrefix(c.Reason, "CreateFailed"); ok && name != "" {
				if cl := errdefs.Class(errdefs.FromClassName(name, "")); cl != errdefs.ErrUnknown {
					class = cl
				}
			}
		}
		return fmt.Errorf("sandbox %s failed on node %s: %s: %w", sb.Name, sb.Spec.NodeName, msg, class)
	case fbv1.PhaseLost:
		return fmt.Errorf("sandbox %s: node %s is lost: %s: %w", sb.Name, sb.Spec.NodeName, msg, errdefs.ErrUnavailable)
	}
	c := meta.FindStatusCondition(sb.Status.Conditions, fbv1.ConditionScheduled)
	if sb.Spec.NodeName == "" && c != nil && c.Status == metav1.ConditionFalse {
		var class error
		switch c.Reason {
		case controller.ReasonUnschedulable:
			class = errdefs.ErrResourceExhausted
		case controller.ReasonCheckpointUnavailable:
			class = errdefs.ErrFailedPrecondition
		case controller.ReasonNodeUnavailable:
			class = errdefs.ErrUnavailable
		default:
			return nil // waiting for its source
		}
		msg := strings.TrimSuffix(c.Message, ": "+class.Error()) // the placer's error names its class too
		return fmt.Errorf("sandbox %s is unschedulable: %s: %w", sb.Name, msg, class)
	}
	return nil
}

// nodeSandbox asks the sandbox's node about it.
func (g *Gateway) nodeSandbox(ctx context.Context, sb *fbv1.Sandbox) (*v1.Sandbox, error) {
	r, err := g.routeTo(ctx, sb)
	if err != nil {
		return nil, err
	}
	resp, err := r.c.GetSandbox(ctx, connect.NewRequest(&v1.GetSandboxRequest{Sandbox: r.id}))
	if err != nil {
		return nil, err
	}
	return nodeView(resp.Msg.Sandbox, sb), nil
}

func (s *sandboxes) GetSandbox(ctx context.Context, req *connect.Request[v1.GetSandboxRequest]) (*connect.Response[v1.GetSandboxResponse], error) {
	sb, err := s.g.sandbox(ctx, req.Msg.Sandbox)
	if err != nil {
		return nil, err
	}
	if sb.Status.LocalID == "" || sb.Status.Phase == fbv1.PhaseLost || !sb.DeletionTimestamp.IsZero() ||
		sb.Closed() || sb.Spec.State == fbv1.StateClosed {
		return connect.NewResponse(&v1.GetSandboxResponse{Sandbox: objectView(sb)}), nil
	}
	out, err := s.g.nodeSandbox(ctx, sb)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&v1.GetSandboxResponse{Sandbox: out}), nil
}

// DeleteSandbox closes the sandbox as one host does: the object asks
// for state Closed, its node closes the local sandbox (nothing of it is
// left on the host; its ledger keeps the record) and reports it Closed;
// the object stays, read and listed (all) as a closed sandbox, until the
// controller's retention deletes it. Closing a closed sandbox is
// NotFound, as on one host. A sandbox not placed yet ran nowhere: its
// object is deleted. A sandbox of a lost node is closed when the node
// comes back; until then the call is Unavailable. Deleting the object
// (a cluster admin's kubectl delete) closes it too, and keeps nothing.
func (s *sandboxes) DeleteSandbox(ctx context.Context, req *connect.Request[v1.DeleteSandboxRequest]) (*connect.Response[v1.DeleteSandboxResponse], error) {
	sb, err := s.g.sandbox(ctx, req.Msg.Sandbox)
	if err != nil {
		return nil, err
	}
	switch {
	case sb.Closed():
		return nil, fmt.Errorf("sandbox %s is already closed: %w", publicID(sb), errdefs.ErrNotFound)
	case sb.Spec.NodeName == "" || !sb.DeletionTimestamp.IsZero():
		if err := s.g.deleteAndWait(ctx, sb); err != nil {
			return nil, err
		}
		return connect.NewResponse(&v1.DeleteSandboxResponse{}), nil
	}
	if sb.Spec.State != fbv1.StateClosed {
		patch := client.MergeFrom(sb.DeepCopy())
		sb.Spec.State = fbv1.StateClosed
		if err := s.g.c.Patch(ctx, sb, patch); err != nil {
			return nil, kerr(err, "close sandbox "+sb.Name)
		}
	}
	err = s.g.await(ctx, "sandbox "+sb.Name+" to be closed", func() (bool, string, error) {
		gone, err := s.g.getFresh(ctx, sb)
		if err != nil || gone {
			return gone, "", err
		}
		status := fmt.Sprintf("phase %q on node %q: %s", sb.Status.Phase, sb.Spec.NodeName, sb.Status.Message)
		if sb.Status.Phase == fbv1.PhaseLost {
			return false, status, fmt.Errorf("close sandbox %s: its node %s is lost (%s); it is closed when the node comes back: %w",
				sb.Name, sb.Spec.NodeName, sb.Status.Message, errdefs.ErrUnavailable)
		}
		return sb.Closed(), status, nil
	})
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&v1.DeleteSandboxResponse{}), nil
}

// deleteAndWait deletes sb's object (if it is still the one read) and
// waits until it is gone: its node, if any, has closed the local sandbox.
func (g *Gateway) deleteAndWait(ctx context.Context, sb *fbv1.Sandbox) error {
	uid := sb.UID
	if err := g.c.Delete(ctx, sb, client.Preconditions{UID: &uid}); err != nil && !apierrors.IsNotFound(err) {
		return kerr(err, "delete sandbox "+sb.Name)
	}
	return g.await(ctx, "sandbox "+sb.Name+" to be deleted", func() (bool, string, error) {
		gone, err := g.getFresh(ctx, sb)
		return gone || sb.UID != uid, fmt.Sprintf("phase %q, finalizers %v", sb.Status.Phase, sb.Finalizers), err
	})
}

// setState asks for a state and waits until the node reports it.
func (g *Gateway) setState(ctx context.Context, ref string, want fbv1.DesiredState, phase fbv1.SandboxPhase, verb string) (*v1.Sandbox, error) {
	sb, err := g.sandbox(ctx, ref)
	if err != nil {
		return nil, err
	}
	if _, err := g.routeTo(ctx, sb); err != nil {
		return nil, fmt.Errorf("%s: %w", verb, err)
	}
	was := sb.Spec.State
	if was != want {
		patch := client.MergeFrom(sb.DeepCopy())
		sb.Spec.State = want
		if err := g.c.Patch(ctx, sb, patch); err != nil {
			return nil, kerr(err, verb+" sandbox "+sb.Name)
		}
	}
	gen := sb.Generation
	err = g.await(ctx, "sandbox "+sb.Name+" to be "+string(phase), func() (bool, string, error) {
		gone, err := g.getFresh(ctx, sb)
		if err != nil {
			return false, "", err
		}
		if gone {
			return false, "", fmt.Errorf("sandbox %s was deleted: %w", sb.Name, errdefs.ErrNotFound)
		}
		status := fmt.Sprintf("phase %q: %s", sb.Status.Phase, sb.Status.Message)
		if sb.Status.ObservedGeneration < gen {
			return false, status, nil
		}
		switch {
		case sb.Status.Phase == phase:
			return true, status, nil
		case sb.Status.Phase == fbv1.PhaseFailed || sb.Status.Phase == fbv1.PhaseLost:
			return false, status, startFailure(sb)
		case sb.Status.Phase == fbv1.PhaseCreating:
			return false, status, nil
		}
		msg := sb.Status.Message
		if msg == "" {
			msg = "the node left it " + strings.ToLower(string(sb.Status.Phase))
		}
		return false, status, fmt.Errorf("%s sandbox %s: %s: %w", verb, sb.Name, msg, errdefs.ErrFailedPrecondition)
	})
	if err != nil {
		if errdefs.IsFailedPrecondition(err) && was != want {
			// The node refused: the object asks again for what runs, so a
			// refused call changes nothing (as on one host).
			patch := client.MergeFrom(sb.DeepCopy())
			sb.Spec.State = was
			if perr := g.c.Patch(context.WithoutCancel(ctx), sb, patch); perr != nil {
				g.log.Warn("could not restore the state asked for", "sandbox", sb.Name, "err", perr)
			}
		}
		return nil, err
	}
	return g.nodeSandbox(ctx, sb)
}

func (s *sandboxes) PauseSandbox(ctx context.Context, req *connect.Request[v1.PauseSandboxRequest]) (*connect.Response[v1.PauseSandboxResponse], error) {
	out, err := s.g.setState(ctx, req.Msg.Sandbox, fbv1.StatePaused, fbv1.PhasePaused, "pause")
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&v1.PauseSandboxResponse{Sandbox: out}), nil
}

func (s *sandboxes) UnpauseSandbox(ctx context.Context, req *connect.Request[v1.UnpauseSandboxRequest]) (*connect.Response[v1.UnpauseSandboxResponse], error) {
	out, err := s.g.setState(ctx, req.Msg.Sandbox, fbv1.StateRunning, fbv1.PhaseRunning, "unpause")
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&v1.UnpauseSandboxResponse{Sandbox: out}), nil
}

func (s *sandboxes) HibernateSandbox(ctx context.Context, req *connect.Request[v1.HibernateSandboxRequest]) (*connect.Response[v1.HibernateSandboxResponse], error) {
	out, err := s.g.setState(ctx, req.Msg.Sandbox, fbv1.StateHibernated, fbv1.PhaseHibernated, "hibernate")
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&v1.HibernateSandboxResponse{Sandbox: out}), nil
}

func (s *sandboxes) WakeSandbox(ctx context.Context, req *connect.Request[v1.WakeSandboxRequest]) (*connect.Response[v1.WakeSandboxResponse], error) {
	out, err := s.g.setState(ctx, req.Msg.Sandbox, fbv1.StateRunning, fbv1.PhaseRunning, "wake")
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&v1.WakeSandboxResponse{Sandbox: out}), nil
}

// RestoreSnapshot is a Sandbox whose source is the checkpoint.
func (s *sandboxes) RestoreSnapshot(ctx context.Context, req *connect.Request[v1.RestoreSnapshotRequest]) (*connect.Response[v1.RestoreSnapshotResponse], error) {
	start := time.Now()
	ck, err := s.g.checkpoint(ctx, req.Msg.Checkpoint)
	if err != nil {
		return nil, err
	}
	src, err := s.g.sourceSandbox(ctx, ck)
	if err != nil {
		return nil, err
	}
	kept, withValue, err := inherit(src, req.Msg.Credentials)
	if err != nil {
		return nil, err
	}
	o := req.Msg.Overrides
	if o == nil {
		o = &v1.Overrides{}
	}
	if err := noOnTimeout(o.OnTimeout, ""); err != nil {
		return nil, err
	}
	spec := fbv1.SandboxSpec{Source: &fbv1.SandboxSource{Checkpoint: ck.Name}, WorkingDir: o.Cwd, State: fbv1.StateRunning}
	if err := fill(&spec, o.Resources, o.Env, o.Egress, o.EgressAllow, o.EgressDeny); err != nil {
		return nil, err
	}
	name := o.Name
	if name == "" && len(withValue) > 0 {
		name = "box-" + utilrand.String(5) // the given values' Secrets are named after it
	}
	sb, err := s.g.newSandbox(name, spec)
	if err != nil {
		return nil, err
	}
	given, err := s.g.putGiven(ctx, sb.Name, withValue, req.Msg.Credentials)
	if err != nil {
		return nil, err
	}
	sb.Spec.Credentials = append(kept, given...)
	out, err := s.g.createAndWait(ctx, sb, o.TimeoutMs)
	if err != nil {
		s.g.dropGiven(ctx, given)
		return nil, err
	}
	s.g.addOwner(ctx, sb.Spec.Credentials, sb, "Sandbox")
	return connect.NewResponse(&v1.RestoreSnapshotResponse{Sandbox: out, StartMs: ms(time.Since(start))}), nil
}
