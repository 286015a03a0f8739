package gateway

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/forkbox/forkbox/api/forkbox/v1"
	"github.com/forkbox/forkbox/errdefs"
	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
	"github.com/forkbox/forkbox/internal/cluster/controller"
)

// environments is the EnvironmentService on Environment objects: a build
// makes the object say the definition (created, or its spec replaced)
// and waits while the controller builds it (a builder Sandbox runs the
// steps on a node, a Checkpoint of it is captured), streaming what the
// objects say as progress; the definition's hash is the spec's, so a
// definition built already is answered at once ("cached"), and a build
// of it that failed is tried again by the next call (the object's retry
// count), as the daemon does. A sandbox of the environment is a member
// of its warm pool when one is ready (pool.go), else a Sandbox whose
// source is the environment.
type environments struct{ g *Gateway }

func (s *environments) BuildEnvironment(ctx context.Context, req *connect.Request[v1.BuildEnvironmentRequest], stream *connect.ServerStream[v1.BuildProgress]) error {
	var mu sync.Mutex
	send := func(p *v1.BuildProgress) {
		mu.Lock()
		defer mu.Unlock()
		_ = stream.Send(p)
	}
	e, _, err := s.g.buildEnvironment(ctx, req.Msg.Definition, send)
	if err != nil {
		return err
	}
	send(&v1.BuildProgress{Phase: "done", Steps: int32(len(e.Spec.Setup)), Message: e.Status.Checkpoint, Environment: s.g.envView(ctx, e)})
	return nil
}

func (s *environments) EnvironmentSandbox(ctx context.Context, req *connect.Request[v1.EnvironmentSandboxRequest]) (*connect.Response[v1.EnvironmentSandboxResponse], error) {
	m := req.Msg
	o := m.Overrides
	if o == nil {
		o = &v1.Overrides{}
	}
	if err := noOnTimeout(o.OnTimeout, ""); err != nil {
		return nil, err
	}
	// The overrides are checked before anything is built.
	sb := &fbv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: s.g.o.Namespace, Name: o.Name},
		Spec: fbv1.SandboxSpec{WorkingDir: o.Cwd, State: fbv1.StateRunning}}
	if err := fill(&sb.Spec, o.Resources, o.Env, o.Egress, o.EgressAllow, o.EgressDeny); err != nil {
		return nil, err
	}
	if o.Name != "" {
		if err := validName("sandbox", o.Name); err != nil {
			return nil, err
		}
	}
	var e *fbv1.Environment
	var built bool
	var err error
	switch {
	case m.NoBuild && m.Definition != nil:
		return nil, fmt.Errorf("no_build takes an environment name, not a definition: %w", errdefs.ErrInvalidArgument)
	case m.Definition != nil:
		e, built, err = s.g.buildEnvironment(ctx, m.Definition, nil)
	default:
		if e, err = s.g.environment(ctx, m.Name); err != nil {
			return nil, err
		}
		if e.Status.Checkpoint == "" && m.NoBuild {
			why := "it is not built"
			if c := meta.FindStatusCondition(e.Status.Conditions, fbv1.ConditionBuilt); c != nil && c.Status == metav1.ConditionFalse && c.Reason != controller.ReasonBuilding {
				why = "its last build failed: " + c.Message
			}
			return nil, fmt.Errorf("environment %s has no snapshot (%s); build it with `forkbox env build`: %w", e.Name, why, errdefs.ErrFailedPrecondition)
		}
		if e.Status.Checkpoint == "" {
			e, built, err = s.g.awaitEnvironment(ctx, e.Name, e.Spec, nil)
		}
	}
	if err != nil {
		return nil, err
	}
	start := time.Now()
	if poolable(sb, o.Name) {
		out, err := s.g.handOver(ctx, e, o.TimeoutMs)
		if err != nil {
			return nil, err
		}
		if out != nil {
			if out.FromCheckpoint == "" {
				out.FromCheckpoint = s.g.checkpointPublicID(ctx, e.Status.Checkpoint)
			}
			return connect.NewResponse(&v1.EnvironmentSandboxResponse{Sandbox: out, Environment: s.g.envView(ctx, e),
				FromPool: true, HandoverMs: ms(time.Since(start)), Built: built}), nil
		}
	}
	sb.Spec.Source = &fbv1.SandboxSource{Environment: e.Name}
	if o.Name == "" {
		sb.GenerateName = e.Name + "-" // as the daemon names them: <environment>-<random>
	}
	out, err := s.g.createAndWait(ctx, sb, o.TimeoutMs)
	if err != nil {
		return nil, err
	}
	if out.FromCheckpoint == "" {
		out.FromCheckpoint = s.g.checkpointPublicID(ctx, e.Status.Checkpoint)
	}
	return connect.NewResponse(&v1.EnvironmentSandboxResponse{Sandbox: out, Environment: s.g.envView(ctx, e),
		HandoverMs: ms(time.Since(start)), Built: built}), nil
}

func (s *environments) GetEnvironment(ctx context.Context, req *connect.Request[v1.GetEnvironmentRequest]) (*connect.Response[v1.GetEnvironmentResponse], error) {
	e, err := s.g.environment(ctx, req.Msg.Name)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&v1.GetEnvironmentResponse{Environment: s.g.envView(ctx, e)}), nil
}

func (s *environments) ListEnvironments(ctx context.Context, _ *connect.Request[v1.ListEnvironmentsRequest]) (*connect.Response[v1.ListEnvironmentsResponse], error) {
	var l fbv1.EnvironmentList
	if err := s.g.c.List(ctx, &l, client.InNamespace(s.g.o.Namespace)); err != nil {
		return nil, kerr(err, "list environments")
	}
	slices.SortFunc(l.Items, func(a, b fbv1.Environment) int { return strings.Compare(a.Name, b.Name) })
	out := &v1.ListEnvironmentsResponse{}
	for i := range l.Items {
		if l.Items[i].DeletionTimestamp.IsZero() {
			out.Environments = append(out.Environments, s.g.envView(ctx, &l.Items[i]))
		}
	}
	return connect.NewResponse(out), nil
}

// DeleteEnvironment deletes the object and waits until it is gone and
// the controller is deleting its warm pool (as the daemon closes a pool
// before it answers); its builder and checkpoints are the controller's to
// collect. Sandboxes started or handed over from it are not affected.
func (s *environments) DeleteEnvironment(ctx context.Context, req *connect.Request[v1.DeleteEnvironmentRequest]) (*connect.Response[v1.DeleteEnvironmentResponse], error) {
	e, err := s.g.environment(ctx, req.Msg.Name)
	if err != nil {
		return nil, err
	}
	if err := s.g.c.Delete(ctx, e, client.Preconditions{UID: &e.UID}); err != nil && !apierrors.IsNotFound(err) {
		return nil, kerr(err, "delete environment "+e.Name)
	}
	err = s.g.await(ctx, "environment "+e.Name+" to be deleted", func() (bool, string, error) {
		gone, err := s.g.getFresh(ctx, e)
		if err != nil || !gone {
			return false, fmt.Sprintf("finalizers %v", e.Finalizers), err
		}
		left, err := s.g.poolLeft(ctx, e)
		return left == 0, fmt.Sprintf("%d warm pool sandboxes not being deleted yet", left), err
	})
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&v1.DeleteEnvironmentResponse{}), nil
}

// environment finds the Environment called name.
func (g *Gateway) environment(ctx context.Context, name string) (*fbv1.Environment, error) {
	if err := checkRef("environment", name); err != nil {
		return nil, err
	}
	e := &fbv1.Environment{ObjectMeta: metav1.ObjectMeta{Namespace: g.o.Namespace, Name: name}}
	gone, err := g.getAPI(ctx, e)
	if err != nil {
		return nil, err
	}
	if gone || !e.DeletionTimestamp.IsZero() {
		return nil, fmt.Errorf("environment %q: %w", name, errdefs.ErrNotFound)
	}
	return e, nil
}

// getAPI reads an Environment from the API server.
func (g *Gateway) getAPI(ctx context.Context, e *fbv1.Environment) (gone bool, err error) {
	err = g.api.Get(ctx, client.ObjectKeyFromObject(e), e)
	if apierrors.IsNotFound(err) {
		return true, nil
	}
	return false, kerr(err, "environment "+e.Name)
}

// envWatch is what a call waiting on an Environment knows it wrote (or
// read) last: that object, at that generation and retry count, of that
// spec hash.
type envWatch struct {
	uid     types.UID
	gen     int64
	retries int
	hash    string
}

// buildNow reads e afresh for a wait on its build of hash: done once it
// is built so, a reason to wait while the cache lags, an error once it is
// gone or redefined; none of the three while the build goes on.
func (g *Gateway) buildNow(ctx context.Context, e *fbv1.Environment, w envWatch, name, hash string) (done bool, wait string, err error) {
	fresh, gone, err := g.envNow(ctx, e, w)
	switch {
	case err != nil:
		return false, "", err
	case !fresh:
		return false, "the gateway's cache has not seen the environment's last write yet", nil
	case gone || !e.DeletionTimestamp.IsZero():
		return false, "", fmt.Errorf("environment %s was deleted while it was building: %w", name, errdefs.ErrNotFound)
	case e.Spec.Hash() != hash:
		return false, "", fmt.Errorf("environment %s was redefined while it was building (its spec's hash is now %s, not %s): %w",
			name, e.Spec.Hash(), hash, errdefs.ErrFailedPrecondition)
	}
	return builtAs(e, hash), "", nil
}

func watchOf(e *fbv1.Environment) envWatch {
	return envWatch{uid: e.UID, gen: e.Generation, retries: fbv1.Retries(e), hash: e.Spec.Hash()}
}

// envNow reads e for a wait, from the cache (a wait reads on every change
// in the namespace: the API server's client would throttle it), once the
// cache has seen what w says was written: until then fresh is false. A
// cached spec of another hash or another object is confirmed with the
// API server (a redefinition, or a cache still behind).
func (g *Gateway) envNow(ctx context.Context, e *fbv1.Environment, w envWatch) (fresh, gone bool, err error) {
	if gone, err = g.getFresh(ctx, e); err != nil || gone {
		return true, gone, err
	}
	if e.UID != w.uid || e.Spec.Hash() != w.hash {
		if gone, err = g.getAPI(ctx, e); err != nil || gone {
			return true, gone, err
		}
		if e.UID != w.uid {
			return true, true, nil // deleted, and made again
		}
	}
	return e.Generation >= w.gen && fbv1.Retries(e) >= w.retries, false, nil
}

// buildEnvironment makes the Environment object say the definition and
// waits until it is built; built reports whether this call started the
// build (a second caller of one definition waits for the first's).
func (g *Gateway) buildEnvironment(ctx context.Context, d *v1.EnvironmentDefinition, send func(*v1.BuildProgress)) (*fbv1.Environment, bool, error) {
	spec, err := specOf(d)
	if err != nil {
		return nil, false, err
	}
	return g.awaitEnvironment(ctx, d.Name, spec, send)
}

// awaitEnvironment defines the environment name as spec, then waits for
// its build.
func (g *Gateway) awaitEnvironment(ctx context.Context, name string, spec fbv1.EnvironmentSpec, send func(*v1.BuildProgress)) (*fbv1.Environment, bool, error) {
	if send == nil {
		send = func(*v1.BuildProgress) {}
	}
	if spec.SetupHash != "" {
		// Built by a client (BeginBuild): answered only once built, so
		// that no builder waits for a client that is not coming.
		e, err := g.environment(ctx, name)
		if err == nil && builtAs(e, spec.Hash()) {
			send(&v1.BuildProgress{Phase: "cached", Message: "already built: " + g.checkpointPublicID(ctx, e.Status.Checkpoint)})
			return e, false, nil
		}
		if err != nil && !errdefs.IsNotFound(err) {
			return nil, false, err
		}
		return nil, false, fmt.Errorf("environment %s has a client-run setup (setup_hash) that is not built: run it with BeginBuild and CompleteBuild (an SDK's setup function): %w",
			name, errdefs.ErrFailedPrecondition)
	}
	e, started, err := g.define(ctx, name, spec)
	if err != nil {
		return nil, false, err
	}
	hash, steps := spec.Hash(), int32(len(spec.Setup))
	if builtAs(e, hash) {
		send(&v1.BuildProgress{Phase: "cached", Steps: steps, Message: "already built: " + g.checkpointPublicID(ctx, e.Status.Checkpoint)})
		return e, false, nil
	}
	if !started {
		send(&v1.BuildProgress{Phase: "wait", Steps: steps, Message: "another caller is building this definition"})
	}
	var last string
	w := watchOf(e)
	err = g.await(ctx, "environment "+name+" to be built", func() (bool, string, error) {
		if done, wait, err := g.buildNow(ctx, e, w, name, hash); done || wait != "" || err != nil {
			return done, wait, err
		}
		if c := failedBuild(e, hash); c != nil {
			return false, "", buildError(e, c)
		}
		p, builder := g.buildProgress(ctx, e, hash)
		if key := p.Phase + "\x00" + p.Message; key != last && started {
			last = key
			g.log.DebugContext(ctx, "build progress", "environment", name, "phase", p.Phase, "message", p.Message)
			send(p) // a build's progress is for the caller that started it (the others were told to wait)
		}
		status := fmt.Sprintf("%s: %s", p.Phase, p.Message)
		// A builder that fails is the controller's to report (above); one
		// that fits no node is answered now, as a create's would be.
		if builder != nil && builder.Status.Phase != fbv1.PhaseFailed && builder.Status.Phase != fbv1.PhaseLost {
			if err := startFailure(builder); err != nil {
				return false, status, fmt.Errorf("environment %s: %w (the Environment object builds once a node has room)", name, err)
			}
		}
		return false, status, nil
	})
	if err != nil {
		return nil, false, err
	}
	return e, started, nil
}

// define creates or updates the Environment called name to say spec, and
// asks for a build of it that failed to be tried again; started reports
// whether a build of spec starts from this call's change.
func (g *Gateway) define(ctx context.Context, name string, spec fbv1.EnvironmentSpec) (*fbv1.Environment, bool, error) {
	hash := spec.Hash()
	for range 5 { // a conflict is another writer: read it again
		e := &fbv1.Environment{ObjectMeta: metav1.ObjectMeta{Namespace: g.o.Namespace, Name: name}}
		err := g.api.Get(ctx, types.NamespacedName{Namespace: g.o.Namespace, Name: name}, e)
		if apierrors.IsNotFound(err) {
			e.Spec = spec
			err = g.c.Create(ctx, e)
			if apierrors.IsAlreadyExists(err) {
				continue
			}
			if err != nil {
				return nil, false, kerr(err, "create environment "+name)
			}
			g.log.InfoContext(ctx, "environment defined", "environment", name, "hash", hash)
			return e, true, nil
		}
		if err != nil {
			return nil, false, kerr(err, "environment "+name)
		}
		if !e.DeletionTimestamp.IsZero() {
			return nil, false, fmt.Errorf("environment %s is being deleted: %w", name, errdefs.ErrFailedPrecondition)
		}
		was := e.Spec.Hash()
		switch {
		case was != hash || !sameMaxAge(e.Spec.MaxAge, spec.MaxAge):
			e.Spec = spec
		case failedBuild(e, hash) != nil:
			if e.Annotations == nil {
				e.Annotations = map[string]string{}
			}
			e.Annotations[fbv1.RetryAnnotation] = fmt.Sprint(fbv1.Retries(e) + 1)
			e.Spec.PoolSize = spec.PoolSize
		case e.Spec.PoolSize != spec.PoolSize: // the same build, a pool of another size
			e.Spec.PoolSize = spec.PoolSize
		default:
			return e, false, nil // built, or a build of it under way
		}
		err = g.c.Update(ctx, e)
		if apierrors.IsConflict(err) {
			continue
		}
		if err != nil {
			return nil, false, kerr(err, "update environment "+name)
		}
		g.log.InfoContext(ctx, "environment defined", "environment", name, "hash", hash, "retry", fbv1.Retries(e))
		return e, was != hash || !builtAs(e, hash), nil
	}
	return nil, false, fmt.Errorf("environment %s: changed by others on every one of 5 tries: %w", name, errdefs.ErrUnavailable)
}

func sameMaxAge(a, b *metav1.Duration) bool {
	return (a == nil && b == nil) || (a != nil && b != nil && a.Duration == b.Duration)
}

// builtAs reports whether e serves a checkpoint built from spec hash.
func builtAs(e *fbv1.Environment, hash string) bool {
	return e.Status.Hash == hash && e.Status.Checkpoint != ""
}

// failedBuild is the Built condition of e when its build of hash failed
// (and no retry of it was asked for since), else nil.
func failedBuild(e *fbv1.Environment, hash string) *metav1.Condition {
	c := meta.FindStatusCondition(e.Status.Conditions, fbv1.ConditionBuilt)
	if c == nil || c.Status != metav1.ConditionFalse || c.Reason == controller.ReasonBuilding || e.Status.Build != fbv1.BuildName(e, hash) {
		return nil
	}
	return c
}

// buildError is a failed build as the daemon reports it: a failed step
// (or capture) is FailedPrecondition; a builder its node refused to
// create has the class of the refusal.
func buildError(e *fbv1.Environment, c *metav1.Condition) error {
	class := errdefs.ErrFailedPrecondition
	if name, ok := strings.CutPrefix(c.Reason, "CreateFailed"); ok && name != "" {
		if cl := errdefs.Class(errdefs.FromClassName(name, "")); cl != errdefs.ErrUnknown {
			class = cl
		}
	}
	msg := strings.TrimSuffix(c.Message, ": "+class.Error())
	return fmt.Errorf("environment %s: %s: %w", e.Name, msg, class)
}

// buildProgress is what the objects say of e's build of hash: whether
// its builder is starting, runs the steps or is being captured; and the
// builder, once there is one.
func (g *Gateway) buildProgress(ctx context.Context, e *fbv1.Environment, hash string) (*v1.BuildProgress, *fbv1.Sandbox) {
	steps := int32(len(e.Spec.Setup))
	build := fbv1.BuildName(e, hash)
	p := &v1.BuildProgress{Phase: "create", Steps: steps, Message: "waiting for the controller to start build " + build}
	if e.Status.Build != build {
		return p, nil
	}
	var sb fbv1.Sandbox
	if err := g.c.Get(ctx, types.NamespacedName{Namespace: e.Namespace, Name: fbv1.BuilderName(build)}, &sb); err != nil || !metav1.IsControlledBy(&sb, e) {
		if c := meta.FindStatusCondition(e.Status.Conditions, fbv1.ConditionBuilt); c != nil && strings.HasPrefix(c.Message, "capturing") {
			p.Phase, p.Message = "checkpoint", c.Message
		}
		return p, nil
	}
	setup := meta.FindStatusCondition(sb.Status.Conditions, fbv1.ConditionSetupComplete)
	switch {
	case setup == nil:
		p.Message = fmt.Sprintf("starting the builder sandbox %s (%s on node %q)", sb.Name, strings.ToLower(string(sb.Status.Phase)), sb.Spec.NodeName)
		if sb.Spec.NodeName == "" {
			p.Message = fmt.Sprintf("starting the builder sandbox %s (not placed yet)", sb.Name)
		}
	case setup.Status == metav1.ConditionUnknown:
		p.Phase, p.Message = "step", fmt.Sprintf("on node %s: %s", sb.Spec.NodeName, setup.Message)
	default:
		p.Phase, p.Message = "checkpoint", fmt.Sprintf("capturing checkpoint %s on node %s", build, sb.Spec.NodeName)
	}
	return p, &sb
}

// checkpointPublicID is the ID callers know the Checkpoint called name
// by (its name if it cannot be read). An Environment names its checkpoint
// once that is Ready, but the cache may show the Environment before the
// Checkpoint's own update (one informer each, no order between them):
// then the API server has its replicas.
func (g *Gateway) checkpointPublicID(ctx context.Context, name string) string {
	if name == "" {
		return ""
	}
	key := types.NamespacedName{Namespace: g.o.Namespace, Name: name}
	var ck fbv1.Checkpoint
	if err := g.c.Get(ctx, key, &ck); err != nil || !hasLocalID(&ck) {
		if err := g.api.Get(ctx, key, &ck); err != nil {
			return name
		}
	}
	return checkpointID(&ck)
}

// hasLocalID: some node has reported its local ID of ck.
func hasLocalID(ck *fbv1.Checkpoint) bool {
	return slices.ContainsFunc(ck.Status.Replicas, func(r fbv1.Replica) bool { return r.LocalID != "" })
}

// envView is an Environment as the daemon's API shows one.
func (g *Gateway) envView(ctx context.Context, e *fbv1.Environment) *v1.Environment {
	out := envState(e)
	out.Checkpoint = g.checkpointPublicID(ctx, e.Status.Checkpoint)
	out.PoolReady = g.poolReady(ctx, e)
	return out
}

// envState is envView but for the checkpoint's ID (which takes a read).
func envState(e *fbv1.Environment) *v1.Environment {
	hash := e.Spec.Hash()
	out := &v1.Environment{Definition: definitionOf(e), Hash: hash}
	if t := e.Status.BuiltAt; t != nil {
		out.BuiltAtUnixMs = t.UnixMilli()
	}
	c := meta.FindStatusCondition(e.Status.Conditions, fbv1.ConditionBuilt)
	switch {
	case failedBuild(e, hash) != nil:
		out.State, out.Error = "failed", c.Message
		if e.Status.Checkpoint != "" {
			out.State = "ready" // the last good build serves on
		}
	case builtAs(e, hash) && (c == nil || c.Reason != controller.ReasonBuilding):
		out.State = "ready"
	case e.Status.Build == "" && e.Status.Checkpoint == "":
		out.State = "new"
	default:
		out.State = "building"
	}
	return out
}
