package daemon

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/forkbox/forkbox/internal/agent"
	"github.com/forkbox/forkbox/internal/store"
)

// Env values, stdin and file contents given to a sandbox are secrets the
// ledger must not show: neither its rows nor the Events API hold them in
// clear, and Resume still replays them.
func TestLedgerSealsReplayInput(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	id := h.create(CreateOptions{Name: "session"})
	if _, err := h.d.Checkpoint(ctx, id, "before"); err != nil {
		t.Fatal(err)
	}
	// The fake host's agent runs on the host: the sandbox's "files" are
	// below a temp dir.
	dir := t.TempDir()
	out, notes := filepath.Join(dir, "out"), filepath.Join(dir, "notes")
	const secret, stdin, content = "env-s3cr3t-value", "stdin-s3cr3t-bytes", "file-s3cr3t-content"
	res, err := h.d.Exec(ctx, id, ExecOptions{ExecRequest: agent.ExecRequest{
		Shell: `printf %s "$SECRET" > "$OUT"; cat >> "$OUT"`,
		Env:   map[string]string{"SECRET": secret, "OUT": out},
		Stdin: []byte(stdin)}}, nil, nil)
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("exec: %+v, %v", res, err)
	}
	if err := h.d.WriteFile(ctx, id, notes, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	raw, err := h.d.store.Events(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	shown, err := h.d.Events(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	for name, evs := range map[string][]*store.Event{"store": raw, "Events API": shown} {
		b, _ := json.Marshal(evs)
		for _, s := range []string{secret, stdin, content} {
			if strings.Contains(string(b), s) {
				t.Errorf("%s ledger holds %q in clear", name, s)
			}
		}
	}
	var started map[string]any
	for _, e := range shown {
		if e.Type == store.EventExecStarted {
			started = e.Data
		}
		if _, ok := e.Data[sealedKey]; ok {
			t.Errorf("the Events API shows sealed replay data: %v", e.Data)
		}
	}
	if names, _ := json.Marshal(started["env_names"]); string(names) != `["OUT","SECRET"]` || started["stdin_bytes"] != float64(len(stdin)) {
		t.Errorf("exec.started as shown: %v; want env names and stdin size in clear", started)
	}

	if err := h.d.Delete(ctx, id); err != nil {
		t.Fatal(err)
	}
	os.Remove(out)
	os.Remove(notes)
	sb, _, replayed, err := h.d.Resume(ctx, "session")
	if err != nil {
		t.Fatal(err)
	}
	defer h.d.Delete(ctx, sb.ID)
	for _, r := range replayed {
		if r.Skipped || r.Err != nil || r.ExitCode != 0 {
			t.Errorf("replayed %s: skipped %v (%s), exit %d, %v", r.ExecID, r.Skipped, r.SkipReason, r.ExitCode, r.Err)
		}
	}
	if b, err := os.ReadFile(out); err != nil || string(b) != secret+stdin {
		t.Errorf("replayed exec wrote %q, %v; want env value then stdin", b, err)
	}
	if b, err := os.ReadFile(notes); err != nil || string(b) != content {
		t.Errorf("replayed write: %q, %v", b, err)
	}
}

// A sealed input opens only for the sandbox and event it was recorded for,
// and ledgers from before sealing are shown without their clear values.
func TestReplayInputBinding(t *testing.T) {
	h := newHarness(t)
	data := h.d.recordedExec("sb-1", "ex-1", &ExecOptions{ExecRequest: agent.ExecRequest{Shell: "x", Env: map[string]string{"K": "v"}}}, false)
	e := &store.Event{SandboxID: "sb-1", Type: store.EventExecStarted, Data: map[string]any{sealedKey: data[sealedKey]}}
	if in, ok, err := h.d.openReplay(e, "ex-1"); err != nil || !ok || in.Env["K"] != "v" {
		t.Errorf("own binding: %+v %v %v", in, ok, err)
	}
	for _, c := range []struct{ sb, ev string }{{"sb-2", "ex-1"}, {"sb-1", "ex-2"}} {
		e.SandboxID = c.sb
		if _, _, err := h.d.openReplay(e, c.ev); err == nil {
			t.Errorf("sealed input opened for %s/%s", c.sb, c.ev)
		}
	}
	for _, o := range []*ExecOptions{
		{ExecRequest: agent.ExecRequest{Shell: "x", Env: map[string]string{"K": "v"}}, NonReplayable: true},
		{ExecRequest: agent.ExecRequest{Shell: "x"}},
	} {
		if _, ok := h.d.recordedExec("sb-1", "ex-1", o, false)[sealedKey]; ok {
			t.Errorf("%+v: sealed input recorded for an exec that needs none", o)
		}
	}
	if _, ok := h.d.recordedExec("sb-1", "ex-1", &ExecOptions{ExecRequest: agent.ExecRequest{Shell: "x", Env: map[string]string{"K": "v"}}}, true)[sealedKey]; ok {
		t.Error("sealed input recorded for a background exec")
	}
	old := []*store.Event{{Type: store.EventExecStarted, Data: map[string]any{"shell": "x", "env": map[string]any{"B": "2", "A": "1"}, "stdin_b64": "c2VjcmV0"}},
		{Type: store.EventFileWritten, Data: map[string]any{"path": "/p", "data_b64": "c2VjcmV0"}}}
	shown := publicEvents(old)
	b, _ := json.Marshal(shown)
	if strings.Contains(string(b), "c2VjcmV0") || strings.Contains(string(b), `"1"`) || !strings.Contains(string(b), `"env_names":["A","B"]`) {
		t.Errorf("an old ledger as shown: %s", b)
	}
	if _, ok := old[0].Data["env"]; !ok {
		t.Error("publicEvents changed the events it was given")
	}
}
