package clusterlab

import (
	"context"
	"fmt"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fbclient "github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/errdefs"
	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
)

// Run creates sb and waits (at most timeout) until it runs on its node and
// answers an exec of `true` there, through the node's own API. It returns
// how long that took from the create, and the sandbox on its node; sb is
// updated to the object as it was then.
func (l *Lab) Run(ctx context.Context, sb *fbv1.Sandbox, timeout time.Duration) (time.Duration, *fbclient.Sandbox, error) {
	start := time.Now()
	err := l.until(ctx, &fbv1.SandboxList{}, sb, timeout, func() error { return l.Plane.Client.Create(ctx, sb) },
		func(o runtime.Object) (bool, error) {
			got, ok := o.(*fbv1.Sandbox)
			if !ok || got.Name != sb.Name {
				return false, nil
			}
			*sb = *got
			switch {
			case got.Status.Phase == fbv1.PhaseRunning && got.Status.LocalID != "":
				return true, nil
			case got.Status.Phase == fbv1.PhaseFailed:
				return false, fmt.Errorf("sandbox %s failed: %s: %w", got.Name, got.Status.Message, errdefs.ErrUnavailable)
			}
			return false, nil
		})
	if err != nil {
		return 0, nil, fmt.Errorf("sandbox %s (phase %q, %s): %w", sb.Name, sb.Status.Phase, sb.Status.Message, err)
	}
	n := l.Cluster.Node(sb.Spec.NodeName)
	if n == nil {
		return 0, nil, fmt.Errorf("sandbox %s runs on %q, not a node of the lab: %w", sb.Name, sb.Spec.NodeName, errdefs.ErrNotFound)
	}
	local, err := n.Client.Sandbox(ctx, sb.Status.LocalID)
	if err != nil {
		return 0, nil, fmt.Errorf("sandbox %s on %s: %w", sb.Name, n.Name, err)
	}
	if _, err := Shell(ctx, local, "true"); err != nil {
		return 0, nil, err
	}
	return time.Since(start), local, nil
}

// Checkpoint creates a Checkpoint called name of sandbox sb in namespace
// ns and waits (at most timeout) until it is Ready; it returns it and how
// long that took. The Checkpoint is returned on failure too (it may
// exist: delete it).
func (l *Lab) Checkpoint(ctx context.Context, ns, name, sb string, timeout time.Duration) (*fbv1.Checkpoint, time.Duration, error) {
	ck := &fbv1.Checkpoint{}
	ck.Namespace, ck.Name, ck.Spec.Sandbox = ns, name, sb
	start := time.Now()
	err := l.until(ctx, &fbv1.CheckpointList{}, ck, timeout, func() error { return l.Plane.Client.Create(ctx, ck) },
		func(o runtime.Object) (bool, error) {
			got, ok := o.(*fbv1.Checkpoint)
			if !ok || got.Name != name {
				return false, nil
			}
			*ck = *got
			switch got.Status.Phase {
			case fbv1.CheckpointReady:
				return true, nil
			case fbv1.CheckpointFailed:
				return false, fmt.Errorf("checkpoint %s failed: %s: %w", name, got.Status.Message, errdefs.ErrUnavailable)
			}
			return false, nil
		})
	if err != nil {
		return ck, 0, fmt.Errorf("checkpoint %s of %s: %w", name, sb, err)
	}
	return ck, time.Since(start), nil
}

// until watches the objects named like obj (of list's kind, in obj's
// namespace) from before act runs, then runs act, and returns when done
// says so of a version of obj, or with done's error, or after timeout.
func (l *Lab) until(ctx context.Context, list client.ObjectList, obj client.Object, timeout time.Duration,
	act func() error, done func(runtime.Object) (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	w, err := l.watch.Watch(ctx, list, client.InNamespace(obj.GetNamespace()), client.MatchingFields{"metadata.name": obj.GetName()})
	if err != nil {
		return err
	}
	defer w.Stop()
	if err := act(); err != nil {
		return err
	}
	for {
		select {
		case <-ctx.Done():
			return fmt.Errorf("not done after %s: %w", timeout, errdefs.ErrDeadlineExceeded)
		case ev, ok := <-w.ResultChan():
			if !ok {
				return fmt.Errorf("the watch of %s ended: %w", obj.GetName(), errdefs.ErrUnavailable)
			}
			if ev.Type == watch.Error {
				return fmt.Errorf("watch of %s: %v: %w", obj.GetName(), apierrors.FromObject(ev.Object), errdefs.ErrUnavailable)
			}
			if ok, err := done(ev.Object); ok || err != nil {
				return err
			}
		}
	}
}

// Delete deletes objs and waits (at most timeout) until every one is gone
// (its node has let it go).
func (l *Lab) Delete(ctx context.Context, timeout time.Duration, objs ...client.Object) error {
	c := l.Plane.Client
	for _, o := range objs {
		if err := c.Delete(ctx, o); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete %s: %w", o.GetName(), err)
		}
	}
	for _, o := range objs {
		err := poll(ctx, timeout, func() (bool, error) {
			err := c.Get(ctx, client.ObjectKeyFromObject(o), o)
			if apierrors.IsNotFound(err) {
				return true, nil
			}
			return false, err
		})
		if err != nil {
			return fmt.Errorf("%s not gone (finalizers %v): %w", o.GetName(), o.GetFinalizers(), err)
		}
	}
	return nil
}

// poll asks cond every 50ms until it holds or fails, or timeout passes.
func poll(ctx context.Context, timeout time.Duration, cond func() (bool, error)) error {
	deadline := time.Now().Add(timeout)
	for {
		if ok, err := cond(); ok || err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not after %s: %w", timeout, errdefs.ErrDeadlineExceeded)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond): // polling a condition with a deadline
		}
	}
}

// Shell runs cmd in sb and returns its stdout; a non-zero exit is an
// error carrying its stderr.
func Shell(ctx context.Context, sb *fbclient.Sandbox, cmd string) (string, error) {
	var out, errb strings.Builder
	res, err := sb.Exec(ctx, fbclient.ExecOptions{Shell: cmd, Stdout: &out, Stderr: &errb})
	if err == nil && res.ExitCode != 0 {
		err = fmt.Errorf("exit %d: %s: %w", res.ExitCode, errb.String(), errdefs.ErrFailedPrecondition)
	}
	if err != nil {
		return "", fmt.Errorf("exec %.80q in %s: %w", cmd, sb.ID, err)
	}
	return out.String(), nil
}
