package nodeagent

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	sbagent "github.com/forkbox/forkbox/internal/agent"
	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
	"github.com/forkbox/forkbox/internal/cluster/kube"
	"github.com/forkbox/forkbox/internal/daemon"
	"github.com/forkbox/forkbox/internal/store"
)

// An Environment's builder Sandbox (labelled with the Environment, and
// annotated with the hash of the spec it builds) gets the Environment's
// setup steps run in it by its node agent, once, in order, after it
// first runs; the agent reports the outcome as the SetupComplete
// condition, which the controller waits for before it checkpoints the
// builder. The steps come from the API (untrusted): each is bounded in
// time, the whole setup too, and only the end of their output is kept.
const (
	setupStepTimeout  = 15 * time.Minute
	setupTotalTimeout = time.Hour
	setupOutputTail   = 2048
)

// Reasons of SetupComplete.
const (
	reasonSetupRunning     = "Running"
	reasonSetupDone        = "SetupDone"
	reasonSetupFailed      = "SetupFailed"
	reasonSetupInterrupted = "Interrupted"
	reasonSetupSuperseded  = "Superseded"
)

// isBuilder reports whether sb is an Environment's builder.
func isBuilder(sb *fbv1.Sandbox) bool {
	return sb.Labels[fbv1.EnvironmentLabel] != "" && sb.Annotations[fbv1.BuildHashAnnotation] != ""
}

// setup runs the builder's setup if it has not run, writing the
// SetupComplete condition before (Running) and after.
func (r *sandboxes) setup(ctx context.Context, before, sb *fbv1.Sandbox, local *store.Sandbox) error {
	if !isBuilder(sb) || local.State != store.StateRunning {
		return nil
	}
	if _, ours := r.setups.Load(sb.UID); ours {
		return nil // run (or running) by this process: the cache may not show its outcome yet
	}
	c := meta.FindStatusCondition(sb.Status.Conditions, fbv1.ConditionSetupComplete)
	switch {
	case c != nil && c.Reason == reasonSetupRunning:
		// Recorded as running, but not by this process: the agent
		// stopped in the middle. Its steps may not be repeatable, so
		// the build fails; the controller tries a changed spec, or the
		// same after maxAge.
		r.setSetup(sb, false, reasonSetupInterrupted, "the node agent stopped during the setup")
		return nil
	case c != nil:
		return nil
	}
	var e fbv1.Environment
	if err := r.api.Get(ctx, types.NamespacedName{Namespace: sb.Namespace, Name: sb.Labels[fbv1.EnvironmentLabel]}, &e); err != nil {
		r.setSetup(sb, false, reasonSetupFailed, "environment: "+err.Error())
		return nil
	}
	if h := e.Spec.Hash(); h != sb.Annotations[fbv1.BuildHashAnnotation] {
		r.setSetup(sb, false, reasonSetupSuperseded, fmt.Sprintf("the environment's spec changed (hash %s, this build %s)", h, sb.Annotations[fbv1.BuildHashAnnotation]))
		return nil
	}
	r.setSetup(sb, false, reasonSetupRunning, fmt.Sprintf("running %d setup steps", len(e.Spec.Setup)))
	if err := r.writeStatus(ctx, before, sb); err != nil {
		return err
	}
	r.setups.Store(sb.UID, struct{}{})
	*before = *sb.DeepCopy()
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, setupTotalTimeout)
	defer cancel()
	for i, step := range e.Spec.Setup {
		out := &tailWriter{max: setupOutputTail}
		res, err := r.d.Exec(ctx, local.ID, daemon.ExecOptions{ExecRequest: sbagent.ExecRequest{Shell: step, Timeout: setupStepTimeout}}, out, out)
		if err == nil && res.ExitCode != 0 {
			err = fmt.Errorf("exited %d; its output ends: %q", res.ExitCode, out.String())
		}
		if err != nil {
			msg := fmt.Sprintf("step %d of %d (%s): %v", i+1, len(e.Spec.Setup), kube.Truncate(step, 256), err)
			r.setSetup(sb, false, reasonSetupFailed, msg)
			r.rec.Eventf(sb, nil, corev1.EventTypeWarning, reasonSetupFailed, "Setup", "%s", kube.Truncate(msg, 1024))
			return nil
		}
	}
	r.setSetup(sb, true, reasonSetupDone, fmt.Sprintf("%d setup steps ran in %s", len(e.Spec.Setup), time.Since(start).Round(time.Millisecond)))
	r.log.InfoContext(ctx, "environment setup done", slog.String("sandbox", sb.Namespace+"/"+sb.Name), slog.String("local", local.ID),
		slog.Int("steps", len(e.Spec.Setup)), slog.Duration("took", time.Since(start)))
	r.rec.Eventf(sb, nil, corev1.EventTypeNormal, reasonSetupDone, "Setup", "%d setup steps of environment %s ran", len(e.Spec.Setup), e.Name)
	return nil
}

func (r *sandboxes) setSetup(sb *fbv1.Sandbox, ok bool, reason, msg string) {
	st := metav1.ConditionFalse
	if ok {
		st = metav1.ConditionTrue
	} else if reason == reasonSetupRunning {
		st = metav1.ConditionUnknown
	}
	meta.SetStatusCondition(&sb.Status.Conditions, metav1.Condition{Type: fbv1.ConditionSetupComplete, Status: st,
		Reason: reason, Message: kube.Truncate(msg, 4096), ObservedGeneration: sb.Generation})
}

// tailWriter keeps the last max bytes written to it.
type tailWriter struct {
	max int
	buf []byte
}

func (w *tailWriter) Write(p []byte) (int, error) {
	w.buf = append(w.buf, p...)
	if len(w.buf) > w.max {
		w.buf = append(w.buf[:0], w.buf[len(w.buf)-w.max:]...)
	}
	return len(p), nil
}

func (w *tailWriter) String() string { return string(w.buf) }
