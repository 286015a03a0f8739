package gateway

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"connectrpc.com/connect"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/forkbox/forkbox/api/forkbox/v1"
	"github.com/forkbox/forkbox/errdefs"
	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
)

// Resume brings back a closed or crashed session as one daemon does: a
// new sandbox starts from the session's last checkpoint, then what its
// ledger recorded after it is replayed. That ledger is on the node that
// captured the checkpoint, so the new Sandbox object (spec.source.resume)
// runs there, and that node replays and reports what it replayed in the
// object's status. Without a checkpoint there is nothing to resume from:
// FailedPrecondition, never a fresh start.
func (s *sandboxes) Resume(ctx context.Context, req *connect.Request[v1.ResumeRequest]) (*connect.Response[v1.ResumeResponse], error) {
	ref := req.Msg.Session
	if err := checkRef("session", ref); err != nil {
		return nil, err
	}
	name, newName := ref, ref
	var since metav1.Time
	sb, err := s.g.sandbox(ctx, ref)
	switch {
	case err == nil:
		if !resumable(sb) {
			return nil, fmt.Errorf("sandbox %s is %s; only a closed or crashed session can be resumed: fork a live one instead: %w",
				sb.Name, phaseOrPending(sb), errdefs.ErrFailedPrecondition)
		}
		name, since = sb.Name, sb.CreationTimestamp
		if !sb.Closed() {
			// A crashed session's object still holds the name (a closed
			// one's gives it up, as on one host): the resumed one gets its own.
			newName = ""
		}
	case errdefs.IsNotFound(err) && !strings.HasPrefix(ref, "sb-"):
		// A closed session's object is gone; its checkpoints stay, by name.
		if err := validName("session", ref); err != nil {
			return nil, err
		}
	default:
		return nil, err
	}
	ck, err := s.g.lastCheckpoint(ctx, name, since)
	if err != nil {
		return nil, err
	}
	if ck == nil {
		if sb == nil { // nothing says a session of that name ever was
			return nil, fmt.Errorf("session %q: no sandbox and no checkpoint of that name: %w", name, errdefs.ErrNotFound)
		}
		return nil, fmt.Errorf("session %s has no checkpoint to resume from: %w", name, errdefs.ErrFailedPrecondition)
	}
	spec := fbv1.SandboxSpec{Source: &fbv1.SandboxSource{Checkpoint: ck.Name, Resume: true}, State: fbv1.StateRunning}
	if sb != nil {
		// The session's credentials come back with it (its node restores
		// them, and the object says so, or its next reconcile would drop
		// them); their Secrets outlive the session's object, which a
		// resume under its name replaces.
		spec.Credentials = slices.Clone(sb.Spec.Credentials)
		if newName != "" {
			s.g.disown(ctx, spec.Credentials, sb.UID)
		}
	}
	nsb, err := s.g.newSandbox(newName, spec)
	if err != nil {
		return nil, err
	}
	if newName == "" {
		nsb.GenerateName = name + "-"
	}
	out, err := s.g.createAndWait(ctx, nsb, 0)
	if err != nil {
		return nil, err
	}
	s.g.addOwner(ctx, spec.Credentials, nsb, "Sandbox")
	// The node reports what it replayed with the phase Running, in one
	// status write; wait for it all the same.
	err = s.g.await(ctx, "sandbox "+nsb.Name+" to report its replay", func() (bool, string, error) {
		gone, err := s.g.getFresh(ctx, nsb)
		if gone {
			err = fmt.Errorf("sandbox %s was deleted while resuming: %w", nsb.Name, errdefs.ErrNotFound)
		}
		return nsb.Status.Resumed != nil, "no replay reported yet", err
	})
	if err != nil {
		return nil, err
	}
	// The node resumed from the session's last checkpoint in its ledger:
	// normally ck; the status names it.
	if used, err := s.g.checkpoint(ctx, nsb.Status.Resumed.Checkpoint); err == nil {
		ck = used
	}
	resp := &v1.ResumeResponse{Sandbox: out, Checkpoint: s.g.checkpointView(ctx, ck)}
	for _, r := range nsb.Status.Resumed.Replayed {
		resp.Replayed = append(resp.Replayed, &v1.ReplayedExec{ExecId: r.ExecID, Argv: r.Argv, Shell: r.Shell,
			Skipped: r.Skipped, SkipReason: r.SkipReason, ExitCode: r.ExitCode, Error: r.Error})
	}
	return connect.NewResponse(resp), nil
}

// resumable: a session whose sandbox is no longer live.
func resumable(sb *fbv1.Sandbox) bool {
	return sb.Closed() || sb.Status.Phase == fbv1.PhaseFailed
}

func phaseOrPending(sb *fbv1.Sandbox) string {
	if sb.Status.Phase == "" {
		return string(fbv1.PhasePending)
	}
	return strings.ToLower(string(sb.Status.Phase))
}

// lastCheckpoint is the newest Ready Checkpoint of the sandbox named name
// not older than since (a sandbox of that name before it is another
// session), nil if none.
func (g *Gateway) lastCheckpoint(ctx context.Context, name string, since metav1.Time) (*fbv1.Checkpoint, error) {
	cks, err := g.readyCheckpoints(ctx, name, since)
	if err != nil || len(cks) == 0 {
		return nil, err
	}
	return &cks[len(cks)-1], nil
}
