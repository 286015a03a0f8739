package nodeagent

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/types"

	"github.com/forkbox/forkbox/errdefs"
	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
	"github.com/forkbox/forkbox/internal/cluster/kube"
	"github.com/forkbox/forkbox/internal/daemon"
	"github.com/forkbox/forkbox/internal/store"
)

// resume starts sb (spec.source.resume) as the daemon resumes a session:
// the session is the sandbox that the checkpoint sb names captured, on
// this node (whose ledger holds its record); it starts from the session's
// last checkpoint and replays what the record holds after it.
func (r *sandboxes) resume(ctx context.Context, sb *fbv1.Sandbox, name string) (*store.Sandbox, error) {
	ckName := sb.Spec.Source.Checkpoint
	var ck fbv1.Checkpoint
	if err := r.api.Get(ctx, types.NamespacedName{Namespace: sb.Namespace, Name: ckName}, &ck); err != nil {
		return nil, fmt.Errorf("checkpoint %q: %v: %w", ckName, err, errdefs.ErrFailedPrecondition)
	}
	if ck.Status.OriginNode != r.o.NodeName {
		return nil, fmt.Errorf("checkpoint %s was captured on node %q, whose ledger holds the session to replay, not on %s: %w",
			ckName, ck.Status.OriginNode, r.o.NodeName, errdefs.ErrFailedPrecondition)
	}
	localID, err := r.heldCopy(ctx, &ck)
	if err != nil {
		return nil, err
	}
	if localID == "" {
		return nil, fmt.Errorf("checkpoint %s has no ready copy on node %s, which captured it: %w", ckName, r.o.NodeName, errdefs.ErrFailedPrecondition)
	}
	local, err := r.d.GetCheckpoint(ctx, localID)
	if err != nil {
		return nil, fmt.Errorf("checkpoint %s (%s here): %w", ckName, localID, err)
	}
	sbx, _, _, err := r.d.ResumeWith(ctx, local.SandboxID, daemon.ResumeOptions{Name: name})
	return sbx, err
}

// reportResumed puts in sb's status what the resume that started local
// replayed, read back from local's own ledger (so a status write lost to
// a crash is written again from the same facts).
func (r *sandboxes) reportResumed(ctx context.Context, sb *fbv1.Sandbox, local *store.Sandbox) error {
	if sb.Spec.Source == nil || !sb.Spec.Source.Resume || sb.Status.Resumed != nil {
		return nil
	}
	evs, err := r.d.Events(ctx, local.ID)
	if err != nil {
		return err
	}
	out := &fbv1.Resumed{}
	done := false
	for _, e := range evs {
		str := func(k string) string { s, _ := e.Data[k].(string); return s }
		switch e.Type {
		case store.EventResumed:
			out.Checkpoint, done = kube.Truncate(str("checkpoint"), 64), true
		case store.EventExecReplayed:
			if len(out.Replayed) == fbv1.MaxReplayed {
				out.Omitted++
				continue
			}
			x := fbv1.ReplayedExec{ExecID: kube.Truncate(str("exec_id"), 64), Shell: kube.Truncate(str("shell"), 1024),
				SkipReason: kube.Truncate(str("skip_reason"), 256), Error: kube.Truncate(str("error"), 1024)}
			x.Skipped, _ = e.Data["skipped"].(bool)
			if n, ok := e.Data["exit_code"].(float64); ok {
				x.ExitCode = int32(n)
			}
			if argv, ok := e.Data["argv"].([]any); ok {
				for _, a := range argv[:min(len(argv), 64)] {
					s, _ := a.(string)
					x.Argv = append(x.Argv, kube.Truncate(s, 1024))
				}
			}
			out.Replayed = append(out.Replayed, x)
		}
	}
	if done { // the resume's last event: until then it is not over
		sb.Status.Resumed = out
	}
	return nil
}
