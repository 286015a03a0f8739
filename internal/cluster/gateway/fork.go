package gateway

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"connectrpc.com/connect"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	utilrand "k8s.io/apimachinery/pkg/util/rand"

	v1 "github.com/forkbox/forkbox/api/forkbox/v1"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/errdefs/errconnect"
	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
)

// forkCall is one Fork or ForkStream in progress.
type forkCall struct {
	g     *Gateway
	start time.Time
	fk    *fbv1.Fork
	ck    *fbv1.Checkpoint
	// captured is when this call saw the checkpoint Ready: a child's
	// start is timed from it to when this call sees the child run (the
	// objects' timestamps are whole seconds).
	captured time.Time
	timeout  int64
	// done holds the children settled so far, by index.
	done map[int]*v1.ForkChild
	// seen is how each child not settled was when last read: the
	// deadline's error says where it stopped.
	seen map[int]string
}

func (s *sandboxes) Fork(ctx context.Context, req *connect.Request[v1.ForkRequest]) (*connect.Response[v1.ForkResponse], error) {
	f, err := s.g.startFork(ctx, req.Msg)
	if err != nil {
		return nil, err
	}
	if err := f.children(ctx, nil); err != nil && !errdefs.IsDeadlineExceeded(err) && !errors.Is(err, errdefs.ErrCanceled) {
		return nil, err
	}
	ck := s.g.checkpointView(ctx, f.ck)
	out := &v1.ForkResponse{Checkpoint: ck, Captured: f.ck.Status.Kind, CaptureMs: ck.CaptureMs, FlushMs: ck.FlushMs}
	started := 0
	for i := range int(f.fk.Spec.Count) {
		c := f.child(i)
		if c.Error == "" {
			started++
		}
		out.Children = append(out.Children, c)
	}
	if started == 0 && !req.Msg.BestEffort {
		return nil, fmt.Errorf("fork of %s: no child started: %s: %w", f.fk.Name, out.Children[0].Error, errorClass(out.Children[0].ErrorClass))
	}
	out.TotalMs = ms(time.Since(f.start))
	return connect.NewResponse(out), nil
}

func (s *sandboxes) ForkStream(ctx context.Context, req *connect.Request[v1.ForkRequest], stream *connect.ServerStream[v1.ForkStreamResponse]) error {
	f, err := s.g.startFork(ctx, req.Msg)
	if err != nil {
		return err
	}
	ck := s.g.checkpointView(ctx, f.ck)
	if err := stream.Send(&v1.ForkStreamResponse{Event: &v1.ForkStreamResponse_Captured{Captured: &v1.ForkCaptured{
		Checkpoint: ck, Captured: f.ck.Status.Kind, CaptureMs: ck.CaptureMs, FlushMs: ck.FlushMs, Count: f.fk.Spec.Count}}}); err != nil {
		return err
	}
	err = f.children(ctx, func(i int, c *v1.ForkChild) error {
		return stream.Send(&v1.ForkStreamResponse{Event: &v1.ForkStreamResponse_Child{Child: &v1.ForkStreamChild{Index: int32(i), Child: c}}})
	})
	if err != nil && !errdefs.IsDeadlineExceeded(err) {
		return err
	}
	done := &v1.ForkDone{}
	for i := range int(f.fk.Spec.Count) {
		if _, ok := f.done[i]; !ok { // past the deadline: said once, here
			c := f.child(i)
			if serr := stream.Send(&v1.ForkStreamResponse{Event: &v1.ForkStreamResponse_Child{Child: &v1.ForkStreamChild{Index: int32(i), Child: c}}}); serr != nil {
				return serr
			}
		}
		if f.child(i).Error == "" {
			done.Started++
		} else {
			done.Failed++
		}
	}
	done.TotalMs = ms(time.Since(f.start))
	return stream.Send(&v1.ForkStreamResponse{Event: &v1.ForkStreamResponse_Done{Done: done}})
}

func errorClass(name string) error {
	for _, c := range []error{errdefs.ErrResourceExhausted, errdefs.ErrFailedPrecondition, errdefs.ErrUnavailable, errdefs.ErrDeadlineExceeded, errdefs.ErrNotFound} {
		if errdefs.ClassName(c) == name {
			return c
		}
	}
	return errdefs.ErrFailedPrecondition
}

// startFork makes the Fork object (after a tagged Checkpoint of the
// source when a tag is asked for) and waits for the checkpoint its
// children start from.
func (g *Gateway) startFork(ctx context.Context, m *v1.ForkRequest) (*forkCall, error) {
	f := &forkCall{g: g, start: time.Now(), done: map[int]*v1.ForkChild{}, seen: map[int]string{}}
	count := m.Count
	if count == 0 {
		count = 1
	}
	if count < 1 || count > 100 {
		return nil, fmt.Errorf("count %d: want 1 to 100: %w", m.Count, errdefs.ErrInvalidArgument)
	}
	o := m.Overrides
	if o == nil {
		o = &v1.Overrides{}
	}
	if err := noOnTimeout(o.OnTimeout, ""); err != nil {
		return nil, err
	}
	f.timeout = o.TimeoutMs
	if f.timeout < 0 {
		return nil, fmt.Errorf("timeout_ms %d: %w", f.timeout, errdefs.ErrInvalidArgument)
	}
	var ov fbv1.ForkOverrides
	var err error
	if ov.Resources, err = resourcesOf(o.Resources); err != nil {
		return nil, err
	}
	if ov.Env, err = envList(o.Env); err != nil {
		return nil, err
	}
	if ov.Egress, err = egressSpec(o.Egress, o.EgressAllow, o.EgressDeny); err != nil {
		return nil, err
	}
	ov.WorkingDir = o.Cwd
	fk := &fbv1.Fork{ObjectMeta: metav1.ObjectMeta{Namespace: g.o.Namespace},
		Spec: fbv1.ForkSpec{Count: count, Memory: m.Memory, Overrides: ov}}
	var base string
	var kept, withValue []fbv1.Credential
	switch {
	case m.FromCheckpoint != "":
		ck, err := g.checkpoint(ctx, m.FromCheckpoint)
		if err != nil {
			return nil, err
		}
		fk.Spec.Source.Checkpoint, fk.Spec.Memory, base = ck.Name, false, ck.Spec.Sandbox
		if err := g.roomFor(ctx, int(count), m.BestEffort); err != nil {
			return nil, err
		}
		src, err := g.sourceSandbox(ctx, ck)
		if err != nil {
			return nil, err
		}
		if kept, withValue, err = inherit(src, m.Credentials); err != nil {
			return nil, err
		}
	default:
		sb, err := g.sandbox(ctx, m.Sandbox)
		if err != nil {
			return nil, err
		}
		if _, err := g.routeTo(ctx, sb); err != nil {
			return nil, fmt.Errorf("fork: %w", err)
		}
		base = sb.Name
		// Before any checkpoint: a refused fork changes nothing.
		if err := g.roomFor(ctx, int(count), m.BestEffort); err != nil {
			return nil, err
		}
		// Its credentials as the API server has them: one set just before
		// the fork (a per-fork one that needs a value, say) may not be in
		// the cache yet.
		if err := g.reread(ctx, sb); err != nil {
			return nil, err
		}
		if kept, withValue, err = inherit(sb, m.Credentials); err != nil {
			return nil, err
		}
		if m.Tag != "" {
			// The Fork's own checkpoint has no tag: take a tagged one first.
			resp, err := (&sandboxes{g}).Checkpoint(ctx, connect.NewRequest(&v1.CheckpointRequest{Sandbox: sb.Name, Tag: m.Tag, Memory: m.Memory}))
			if err != nil {
				return nil, err
			}
			ck, err := g.checkpoint(ctx, resp.Msg.Checkpoint.Id)
			if err != nil {
				return nil, err
			}
			fk.Spec.Source.Checkpoint, fk.Spec.Memory = ck.Name, false
		} else {
			fk.Spec.Source.Sandbox = sb.Name
		}
	}
	if o.Name != "" {
		if count > 1 {
			return nil, fmt.Errorf("overrides.name %q names one child; a fork of %d takes none: %w", o.Name, count, errdefs.ErrInvalidArgument)
		}
		if err := validName("fork", o.Name); err != nil {
			return nil, err
		}
		fk.Name = o.Name
	} else {
		if len(base) > 40 {
			base = base[:40]
		}
		fk.GenerateName = "fork-" + base + "-" // children: fork-<parent>-<short>-<i>, as on one host
		if len(withValue) > 0 {
			// The given values' Secrets are named after the Fork: name it now.
			fk.Name, fk.GenerateName = fk.GenerateName+utilrand.String(5), ""
		}
	}
	given, err := g.putGiven(ctx, fk.Name, withValue, m.Credentials)
	if err != nil {
		return nil, err
	}
	fk.Spec.Overrides.Credentials = given // the controller adds the inherited ones
	if err := g.c.Create(ctx, fk); err != nil {
		g.dropGiven(ctx, given)
		return nil, kerr(err, "create fork")
	}
	g.addOwner(ctx, append(kept, given...), fk, "Fork")
	f.fk = fk
	if err := f.capture(ctx); err != nil {
		return nil, err
	}
	return f, nil
}

// capture waits until the Fork's checkpoint is Ready.
func (f *forkCall) capture(ctx context.Context) error {
	g, fk := f.g, f.fk
	return g.await(ctx, "the checkpoint of fork "+fk.Name, func() (bool, string, error) {
		gone, err := g.getFresh(ctx, fk)
		if err != nil {
			return false, "", err
		}
		if gone {
			return false, "", fmt.Errorf("fork %s was deleted: %w", fk.Name, errdefs.ErrNotFound)
		}
		status := fmt.Sprintf("phase %q: %s", fk.Status.Phase, fk.Status.Message)
		if fk.Status.Phase == fbv1.ForkFailed {
			return false, status, fmt.Errorf("fork %s failed: %s: %w", fk.Name, fk.Status.Message, errdefs.ErrFailedPrecondition)
		}
		if fk.Status.Checkpoint == "" {
			return false, status, nil
		}
		var ck fbv1.Checkpoint
		if err := g.c.Get(ctx, types.NamespacedName{Namespace: fk.Namespace, Name: fk.Status.Checkpoint}, &ck); err != nil {
			if apierrors.IsNotFound(err) {
				return false, status, nil
			}
			return false, status, kerr(err, "checkpoint "+fk.Status.Checkpoint)
		}
		f.ck = &ck
		if ck.Status.Phase == fbv1.CheckpointFailed {
			return false, status, fmt.Errorf("fork %s: checkpoint failed: %s: %w", fk.Name, ck.Status.Message, errdefs.ErrFailedPrecondition)
		}
		ready := ck.Status.Phase == fbv1.CheckpointReady
		if ready && f.captured.IsZero() {
			f.captured = time.Now()
		}
		return ready, status, nil
	})
}

func childName(fk *fbv1.Fork, i int) string { return fk.Name + "-" + strconv.Itoa(i) }

// children waits until every child has settled, calling each (if set)
// for each child as it does.
func (f *forkCall) children(ctx context.Context, each func(int, *v1.ForkChild) error) error {
	g, fk := f.g, f.fk
	n := int(fk.Spec.Count)
	return g.await(ctx, "the children of fork "+fk.Name, func() (bool, string, error) {
		if _, err := g.getFresh(ctx, fk); err != nil {
			return false, "", err
		}
		for i := range n {
			if _, ok := f.done[i]; ok {
				continue
			}
			c, err := f.settle(ctx, i)
			if err != nil {
				return false, "", err
			}
			if c == nil {
				continue
			}
			f.done[i] = c
			if each != nil {
				if err := each(i, c); err != nil {
					return false, "", err
				}
			}
		}
		return len(f.done) == n, fmt.Sprintf("%d of %d children settled (%s)", len(f.done), n, fk.Status.Message), nil
	})
}

// settle is child i once it runs or will not, else nil.
func (f *forkCall) settle(ctx context.Context, i int) (*v1.ForkChild, error) {
	g, fk := f.g, f.fk
	var sb fbv1.Sandbox
	err := g.c.Get(ctx, types.NamespacedName{Namespace: fk.Namespace, Name: childName(fk, i)}, &sb)
	if apierrors.IsNotFound(err) {
		for _, c := range fk.Status.Children {
			if c.Name == childName(fk, i) && (c.Phase == fbv1.PhaseFailed || c.Phase == fbv1.PhaseTerminating) {
				return failedChild(fmt.Errorf("child %s: %s: %w", c.Name, c.Message, errdefs.ErrFailedPrecondition)), nil
			}
		}
		f.seen[i] = fmt.Sprintf("not made yet; the fork is %q: %s", fk.Status.Phase, fk.Status.Message)
		return nil, nil
	}
	if err != nil {
		return nil, kerr(err, "child "+childName(fk, i))
	}
	if sb.Status.Phase == fbv1.PhaseRunning && sb.Status.LocalID != "" {
		out, err := g.nodeSandbox(ctx, &sb)
		if err == nil && f.timeout > 0 {
			var r *route
			if r, err = g.routeTo(ctx, &sb); err == nil {
				var resp *connect.Response[v1.SetTimeoutResponse]
				if resp, err = r.c.SetTimeout(ctx, connect.NewRequest(&v1.SetTimeoutRequest{Sandbox: r.id, TimeoutMs: f.timeout})); err == nil {
					out = nodeView(resp.Msg.Sandbox, &sb)
				}
			}
		}
		if err != nil {
			return failedChild(errconnect.FromConnect(err)), nil
		}
		c := &v1.ForkChild{Sandbox: out}
		from := f.captured
		if from.IsZero() {
			from = f.start
		}
		c.StartMs = ms(time.Since(from))
		return c, nil
	}
	if err := startFailure(&sb); err != nil {
		// The caller learns only the error, not the child's name: one
		// unschedulable would start whenever a node has room, long after
		// this call, and one failed on its node holds that node's slot
		// until it is closed. Neither is left unseen (as on one host, where
		// a failed child leaves nothing).
		if derr := g.c.Delete(context.WithoutCancel(ctx), &sb); derr != nil && !apierrors.IsNotFound(derr) {
			g.log.Warn("could not delete a failed child", "sandbox", sb.Name, "err", derr)
		}
		return failedChild(err), nil
	}
	f.seen[i] = fmt.Sprintf("phase %q on node %q: %s", sb.Status.Phase, sb.Spec.NodeName, sb.Status.Message)
	return nil, nil
}

func failedChild(err error) *v1.ForkChild {
	return &v1.ForkChild{Error: err.Error(), ErrorClass: errdefs.ClassName(err)}
}

// child is child i as settled, or the deadline's error.
func (f *forkCall) child(i int) *v1.ForkChild {
	if c, ok := f.done[i]; ok {
		return c
	}
	seen := f.seen[i]
	if seen == "" {
		seen = "never read"
	}
	return failedChild(fmt.Errorf("child %s is not running by the deadline (it may still start; last seen %s): %w", childName(f.fk, i), seen, errdefs.ErrDeadlineExceeded))
}
