package daemon

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"slices"
	"time"

	"github.com/forkbox/forkbox/internal/agent"
	"github.com/forkbox/forkbox/internal/store"
)

// What the ledger keeps of an exec or a file write, so that Resume can
// replay it. The ledger is shown to users (`forkbox logs`, the Events API),
// so it holds in clear only facts that are not secret: the command, the
// names of its env variables, its cwd, timeout and sizes. What a replay
// also needs (env values, stdin, a file's content) is sealed with the
// daemon's key, bound to the sandbox and the event, in the "sealed" field,
// which the Events API leaves out.

// maxRecordedBytes bounds stdin and file contents kept in the ledger for
// Resume to replay; larger ones are recorded as omitted.
const maxRecordedBytes = 64 << 10

// sealedKey is the event field that holds sealed replay data.
const sealedKey = "sealed"

// replayInput is what an event needs sealed to be replayed.
type replayInput struct {
	Env   map[string]string `json:"env,omitempty"`
	Stdin []byte            `json:"stdin,omitempty"`
	Data  []byte            `json:"data,omitempty"`
}

// replayBinding is the additional data a sandbox's replay input is sealed
// with: it opens only for the event it was recorded with.
func replayBinding(sandboxID, eventID string) string {
	return "ledger\x00" + sandboxID + "\x00" + eventID
}

func (d *Daemon) sealReplay(sandboxID, eventID string, in replayInput) string {
	b, _ := json.Marshal(in)
	return base64.StdEncoding.EncodeToString(d.sealer.Seal(replayBinding(sandboxID, eventID), b))
}

func (d *Daemon) openReplay(e *store.Event, eventID string) (replayInput, bool, error) {
	var in replayInput
	s, ok := e.Data[sealedKey].(string)
	if !ok {
		return in, false, nil
	}
	b, err := base64.StdEncoding.DecodeString(s)
	if err == nil {
		b, err = d.sealer.Open(replayBinding(e.SandboxID, eventID), b)
	}
	if err == nil {
		err = json.Unmarshal(b, &in)
	}
	return in, true, err
}

// recordedExec is what the ledger keeps of an exec started in sandboxID:
// the command in clear, its env values and stdin (when small) sealed.
// Credentials are not in it: they are added after, on the way to the agent.
// Execs that are never replayed (background, non-replayable) keep no
// sealed input.
func (d *Daemon) recordedExec(sandboxID, execID string, o *ExecOptions, background bool) map[string]any {
	data := map[string]any{"exec_id": execID}
	if o.Shell != "" {
		data["shell"] = o.Shell
	} else {
		data["argv"] = o.Argv
	}
	if o.Cwd != "" {
		data["cwd"] = o.Cwd
	}
	var in replayInput
	if len(o.Env) > 0 {
		names := make([]string, 0, len(o.Env))
		for k := range o.Env {
			names = append(names, k)
		}
		slices.Sort(names)
		data["env_names"] = names
		in.Env = o.Env
	}
	if n := len(o.Stdin); n > 0 {
		data["stdin_bytes"] = n
		if n > maxRecordedBytes {
			data["stdin_omitted"] = true
		} else {
			in.Stdin = o.Stdin
		}
	}
	if o.Timeout > 0 {
		data["timeout_ms"] = o.Timeout.Milliseconds()
	}
	if o.NonReplayable {
		data["non_replayable"] = true
	}
	if background {
		data["background"] = true
	}
	if !o.NonReplayable && !background && (in.Env != nil || in.Stdin != nil) {
		data[sealedKey] = d.sealReplay(sandboxID, execID, in)
	}
	return data
}

// recordedWrite is what the ledger keeps of a file written in sandboxID:
// its path, size and mode in clear, its content (when small) sealed.
func (d *Daemon) recordedWrite(sandboxID, path string, content []byte, mode uint32) map[string]any {
	id := newID("fw-")
	data := map[string]any{"write_id": id, "path": path, "size": len(content), "mode": mode}
	if len(content) <= maxRecordedBytes {
		data[sealedKey] = d.sealReplay(sandboxID, id, replayInput{Data: content})
	}
	return data
}

// publicEvents returns the ledger as users see it: sealed replay data left
// out, and what ledgers written before it was sealed kept in clear (env
// values, stdin, file contents) reduced to names and sizes.
func publicEvents(evs []*store.Event) []*store.Event {
	out := make([]*store.Event, len(evs))
	for i, e := range evs {
		_, sealed := e.Data[sealedKey]
		env, clearEnv := e.Data["env"].(map[string]any)
		_, clearStdin := e.Data["stdin_b64"]
		_, clearData := e.Data["data_b64"]
		if !sealed && !clearEnv && !clearStdin && !clearData {
			out[i] = e
			continue
		}
		c := *e
		c.Data = make(map[string]any, len(e.Data))
		for k, v := range e.Data {
			switch k {
			case sealedKey, "env", "stdin_b64", "data_b64":
			default:
				c.Data[k] = v
			}
		}
		if clearEnv {
			names := make([]string, 0, len(env))
			for k := range env {
				names = append(names, k)
			}
			slices.Sort(names)
			c.Data["env_names"] = names
		}
		out[i] = &c
	}
	return out
}

// replay re-runs one recorded event (exec.started or file.written) in sb;
// ok is false for events that are not replayable actions.
func (d *Daemon) replay(ctx context.Context, sb *store.Sandbox, e *store.Event) (Replayed, bool) {
	str := func(k string) string { s, _ := e.Data[k].(string); return s }
	switch e.Type {
	case store.EventFileWritten:
		return d.replayWrite(ctx, sb, e), true
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
	in, sealed, err := d.openReplay(e, r.ExecID)
	if err != nil {
		r.Skipped, r.SkipReason = true, "its recorded input cannot be unsealed (was the credentials key replaced?)"
		return r, true
	}
	if sealed {
		o.Env, o.Stdin = in.Env, in.Stdin
	} else {
		// A ledger written before replay input was sealed.
		if env, ok := e.Data["env"].(map[string]any); ok {
			o.Env = map[string]string{}
			for k, v := range env {
				o.Env[k], _ = v.(string)
			}
		}
		if s := str("stdin_b64"); s != "" {
			o.Stdin, _ = base64.StdEncoding.DecodeString(s)
		}
	}
	if t, ok := e.Data["timeout_ms"].(float64); ok {
		o.Timeout = time.Duration(t) * time.Millisecond
	}
	res, err := d.Exec(ctx, sb.ID, o, io.Discard, io.Discard)
	r.ExitCode, r.Err = res.ExitCode, err
	return r, true
}

// replayWrite writes a recorded file again.
func (d *Daemon) replayWrite(ctx context.Context, sb *store.Sandbox, e *store.Event) Replayed {
	path, _ := e.Data["path"].(string)
	id, _ := e.Data["write_id"].(string)
	r := Replayed{ExecID: "file:" + path}
	var content []byte
	in, sealed, err := d.openReplay(e, id)
	switch {
	case err != nil:
		r.Skipped, r.SkipReason = true, "its recorded content cannot be unsealed (was the credentials key replaced?)"
		return r
	case sealed:
		content = in.Data
	default:
		s, ok := e.Data["data_b64"].(string) // a ledger written before contents were sealed
		if !ok {
			r.Skipped, r.SkipReason = true, "the file's content was too large to record"
			return r
		}
		content, _ = base64.StdEncoding.DecodeString(s)
	}
	mode, _ := e.Data["mode"].(float64)
	r.Err = d.agent(sb).WriteFile(ctx, path, content, fsMode(uint32(mode)))
	return r
}
