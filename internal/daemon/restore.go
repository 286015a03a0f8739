package daemon

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/agent"
	"github.com/forkbox/forkbox/internal/store"
)

// RestoreSnapshot starts a new sandbox from a checkpoint. Its exec history
// is clean: nothing is replayed (that is what Resume does).
func (d *Daemon) RestoreSnapshot(ctx context.Context, checkpoint string, o Overrides, credentials map[string]string) (*store.Sandbox, error) {
	ck, err := d.store.GetCheckpoint(ctx, checkpoint)
	if err != nil {
		return nil, err
	}
	if _, err := withOverrides(ck.Config, o); err != nil {
		return nil, err
	}
	creds, err := d.inheritedCredentials(ctx, ck.SandboxID, credentials)
	if err != nil {
		return nil, err
	}
	return d.startFromCheckpoint(ctx, startOptions{checkpoint: ck, overrides: o, defaultName: "restore-" + ck.ID[len("ck-"):],
		creds: creds, event: map[string]any{"restored_from": ck.ID, "tag": ck.Tag}})
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
	old, err := d.store.GetSandbox(ctx, session)
	if err != nil {
		return nil, nil, nil, err
	}
	if err := requireState(old, "resume (fork a live session instead)", store.StateClosed, store.StateFailed); err != nil {
		return nil, nil, nil, err
	}
	cks, err := d.store.ListCheckpoints(ctx, old.ID)
	if err != nil {
		return nil, nil, nil, err
	}
	if len(cks) == 0 {
		return nil, nil, nil, fmt.Errorf("session %s has no checkpoint to resume from: %w", old.ID, errdefs.ErrFailedPrecondition)
	}
	ck := cks[len(cks)-1]
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
	sb, err := d.startFromCheckpoint(ctx, startOptions{checkpoint: ck, defaultName: old.Name, parentID: old.ID, creds: creds,
		event: map[string]any{"resumed_from": old.ID, "checkpoint": ck.ID}})
	if err != nil {
		return nil, nil, nil, err
	}
	var out []Replayed
	for _, e := range evs {
		if e.Seq <= ck.LedgerSeq {
			continue
		}
		r, ok := d.replay(ctx, sb, e)
		if !ok {
			continue
		}
		out = append(out, r)
		data := map[string]any{"exec_id": r.ExecID, "skipped": r.Skipped, "exit_code": r.ExitCode}
		if r.SkipReason != "" {
			data["skip_reason"] = r.SkipReason
		}
		d.note(ctx, sb.ID, store.EventExecReplayed, data)
	}
	d.note(ctx, sb.ID, store.EventResumed, map[string]any{"session": old.ID, "checkpoint": ck.ID, "replayed": len(out)})
	return sb, ck, out, nil
}

// replay re-runs one recorded event (exec.started or file.written) in sb;
// ok is false for events that are not replayable actions.
func (d *Daemon) replay(ctx context.Context, sb *store.Sandbox, e *store.Event) (Replayed, bool) {
	str := func(k string) string { s, _ := e.Data[k].(string); return s }
	switch e.Type {
	case store.EventFileWritten:
		r := Replayed{ExecID: "file:" + str("path")}
		data, ok := e.Data["data_b64"].(string)
		if !ok {
			r.Skipped, r.SkipReason = true, "the file's content was too large to record"
			return r, true
		}
		b, _ := base64.StdEncoding.DecodeString(data)
		mode, _ := e.Data["mode"].(float64)
		r.Err = d.agent(sb).WriteFile(ctx, str("path"), b, fsMode(uint32(mode)))
		return r, true
	case store.EventExecStarted:
	default:
		return Replayed{}, false
	}
	r := Replayed{ExecID: str("exec_id"), Shell: str("shell")}
	if argv, ok := e.Data["argv"].([]any); ok {
		for _, a := range argv {
			s, _ := a.(string)
			r.Argv = append(r.Argv, s)
		}
	}
	switch {
	case e.Data["non_replayable"] == true:
		r.Skipped, r.SkipReason = true, "marked non-replayable"
		return r, true
	case e.Data["background"] == true:
		r.Skipped, r.SkipReason = true, "background process"
		return r, true
	case e.Data["stdin_omitted"] == true:
		r.Skipped, r.SkipReason = true, "its stdin was too large to record"
		return r, true
	}
	o := ExecOptions{ExecRequest: agent.ExecRequest{Argv: r.Argv, Shell: r.Shell, Cwd: str("cwd")}}
	if env, ok := e.Data["env"].(map[string]any); ok {
		o.Env = map[string]string{}
		for k, v := range env {
			o.Env[k], _ = v.(string)
		}
	}
	if in := str("stdin_b64"); in != "" {
		o.Stdin, _ = base64.StdEncoding.DecodeString(in)
	}
	if t, ok := e.Data["timeout_ms"].(float64); ok {
		o.Timeout = time.Duration(t) * time.Millisecond
	}
	res, err := d.Exec(ctx, sb.ID, o, io.Discard, io.Discard)
	r.ExitCode, r.Err = res.ExitCode, err
	return r, true
}
