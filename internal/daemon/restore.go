package daemon

import (
	"context"
	"fmt"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/credentials"
	"github.com/forkbox/forkbox/internal/store"
)

// RestoreSnapshot starts a new sandbox from a checkpoint. Its exec history
// is clean: nothing is replayed (that is what Resume does).
func (d *Daemon) RestoreSnapshot(ctx context.Context, checkpoint string, o Overrides, credentials map[string]string) (*store.Sandbox, error) {
	ck, err := d.store.GetCheckpoint(ctx, checkpoint)
	if err != nil {
		return nil, err
	}
	creds, err := d.inheritedCredentials(ctx, ck.SandboxID, credentials)
	if err != nil {
		return nil, err
	}
	return d.startFromCheckpoint(ctx, startOptions{checkpoint: ck, overrides: o, defaultName: "restore-" + ck.ID[len("ck-"):],
		creds: creds, event: map[string]any{"restored_from": ck.ID, "tag": ck.Tag}})
}

// CredentialValue is a credential with its clear value (what a cluster
// node reads from the Secret a Sandbox object names).
type CredentialValue struct {
	Spec  CredentialSpec
	Value string
}

// RestoreSnapshotWith starts a new sandbox from a checkpoint, like
// RestoreSnapshot, but with exactly creds rather than what the
// checkpoint's sandbox holds now: in cluster mode a Sandbox object names
// all of its credentials, and the checkpoint's sandbox may be on another
// node.
func (d *Daemon) RestoreSnapshotWith(ctx context.Context, checkpoint string, o Overrides, creds []CredentialValue) (*store.Sandbox, error) {
	ck, err := d.store.GetCheckpoint(ctx, checkpoint)
	if err != nil {
		return nil, err
	}
	if len(creds) > credentials.MaxPerSandbox {
		return nil, fmt.Errorf("%d credentials, the limit is %d: %w", len(creds), credentials.MaxPerSandbox, errdefs.ErrResourceExhausted)
	}
	var sealed []*store.Credential
	for _, c := range creds {
		if err := credentials.Check(c.Spec, c.Value); err != nil {
			return nil, err
		}
		sealed = append(sealed, &store.Credential{Name: c.Spec.Name, Env: c.Spec.Env, File: c.Spec.File, PerFork: c.Spec.PerFork,
			Sealed: d.sealer.Seal(c.Spec.Name, []byte(c.Value))})
	}
	return d.startFromCheckpoint(ctx, startOptions{checkpoint: ck, overrides: o, defaultName: "restore-" + ck.ID[len("ck-"):],
		creds: sealed, event: map[string]any{"restored_from": ck.ID, "tag": ck.Tag}})
}

// Replayed is the outcome of one exec replayed by Resume.
type Replayed struct {
	ExecID     string
	Argv       []string
	Shell      string
	Skipped    bool
	SkipReason string
	ExitCode   int
	Err        error
}

// Resume brings back a closed or crashed session: a new sandbox (with the
// session's name) starts from the session's last checkpoint, then the execs
// and file writes the ledger recorded after that checkpoint are replayed in
// order. Execs marked non-replayable, and background execs, are skipped and
// reported. Without a checkpoint there is nothing to resume from: that is a
// FailedPrecondition error, never a fresh start.
func (d *Daemon) Resume(ctx context.Context, session string) (*store.Sandbox, *store.Checkpoint, []Replayed, error) {
	return d.ResumeWith(ctx, session, ResumeOptions{})
}

// ResumeOptions change what Resume does.
type ResumeOptions struct {
	// Name of the new sandbox; empty: the session's name.
	Name string
}

// ResumeWith is Resume with options (cluster mode names the new sandbox
// after its object).
func (d *Daemon) ResumeWith(ctx context.Context, session string, o ResumeOptions) (*store.Sandbox, *store.Checkpoint, []Replayed, error) {
	old, err := d.store.GetSandbox(ctx, session)
	if err != nil {
		return nil, nil, nil, err
	}
	if err := requireState(old, "resume", store.StateClosed, store.StateFailed); err != nil {
		return nil, nil, nil, fmt.Errorf("%w; only a closed or crashed session can be resumed: fork a live one instead", err)
	}
	ck, since, err := d.resumePoint(ctx, old)
	if err != nil {
		return nil, nil, nil, err
	}
	name := old.Name
	if o.Name != "" {
		name = o.Name
	}
	evs, err := d.store.Events(ctx, old.ID)
	if err != nil {
		return nil, nil, nil, err
	}
	// The same session: its credentials come back as they were, per-fork
	// ones included.
	creds, err := d.store.Credentials(ctx, old.ID)
	if err != nil {
		return nil, nil, nil, err
	}
	if _, _, err := d.checkStart(ctx, ck.Config, ck.Runtime, ck.Image, ck.ImageDigest, Overrides{}); err != nil {
		return nil, nil, nil, err
	}
	if old.State == store.StateFailed {
		// A crashed session still holds its name, address and host state.
		if err := d.Delete(ctx, old.ID); err != nil {
			return nil, nil, nil, fmt.Errorf("clean up the crashed session first: %w", err)
		}
	}
	sb, err := d.startFromCheckpoint(ctx, startOptions{checkpoint: ck, defaultName: name, parentID: old.ID, creds: creds,
		event: map[string]any{"resumed_from": old.ID, "checkpoint": ck.ID}})
	if err != nil {
		return nil, nil, nil, err
	}
	var out []Replayed
	for _, e := range evs {
		if e.Seq <= since {
			continue
		}
		r, ok := d.replay(ctx, sb, e)
		if !ok {
			continue
		}
		out = append(out, r)
		d.note(ctx, sb.ID, store.EventExecReplayed, replayedData(r))
	}
	d.note(ctx, sb.ID, store.EventResumed, map[string]any{"session": old.ID, "checkpoint": ck.ID, "replayed": len(out)})
	return sb, ck, out, nil
}

// resumePoint is the checkpoint session old resumes from, and the ledger
// seq after which its execs are replayed: its own last checkpoint; with
// none, the one it started from (a session resumed before, a fork child, a
// restore), every exec of its own replayed after it, with its own config
// (a child's overrides). Before, a session resumed once could not be
// resumed again.
func (d *Daemon) resumePoint(ctx context.Context, old *store.Sandbox) (*store.Checkpoint, int64, error) {
	cks, err := d.store.ListCheckpoints(ctx, old.ID)
	if err != nil {
		return nil, 0, err
	}
	if len(cks) > 0 {
		ck := cks[len(cks)-1]
		return ck, ck.LedgerSeq, nil
	}
	if old.FromCheckpoint != "" {
		ck, err := d.store.GetCheckpoint(ctx, old.FromCheckpoint)
		if err == nil {
			own := *ck
			own.Config = old.Config
			return &own, 0, nil
		}
		if !errdefs.IsNotFound(err) {
			return nil, 0, err
		}
	}
	return nil, 0, fmt.Errorf("session %s has no checkpoint to resume from: %w", old.ID, errdefs.ErrFailedPrecondition)
}

// replayedData is what the ledger keeps of a replayed exec: its outcome
// and its command (in clear in the session's ledger already), so that the
// outcome of a resume can be read back from the new sandbox's own ledger
// (cluster mode reports it so, after a crash too).
func replayedData(r Replayed) map[string]any {
	data := map[string]any{"exec_id": r.ExecID, "skipped": r.Skipped, "exit_code": r.ExitCode}
	if r.SkipReason != "" {
		data["skip_reason"] = r.SkipReason
	}
	if r.Shell != "" {
		data["shell"] = r.Shell
	}
	if len(r.Argv) > 0 {
		data["argv"] = r.Argv
	}
	if r.Err != nil {
		data["error"] = r.Err.Error()
	}
	return data
}
