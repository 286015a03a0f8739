package daemon

import (
	"context"
	"slices"
	"testing"

	"github.com/forkbox/forkbox/internal/agent"
	"github.com/forkbox/forkbox/internal/store"
)

// An exec (plain, streamed, pty or background) whose request cannot be made whole (here: a
// credential that does not open) fails without recording exec.started: an
// exec.started is always followed by its exec.finished. (CI once saw a pty
// session whose caller went away leave exec.started alone: the credentials
// were read with the caller's context, after the event.)
func TestExecStartedHasFinished(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	id := h.create(CreateOptions{Name: "src"})
	if err := h.d.store.PutCredential(ctx, &store.Credential{SandboxID: id, Name: "broken", Env: "TOKEN", Sealed: []byte("not sealed by this daemon")}); err != nil {
		t.Fatal(err)
	}
	req := agent.ExecRequest{Argv: []string{"true"}}
	if _, err := h.d.Exec(ctx, id, ExecOptions{ExecRequest: req}, nil, nil); err == nil {
		t.Fatal("exec with a credential that does not open: no error")
	}
	if _, err := h.d.Pty(ctx, id, PtyOptions{ExecRequest: req}); err == nil {
		t.Fatal("pty with a credential that does not open: no error")
	}
	if _, err := h.d.ExecStream(ctx, id, ExecOptions{ExecRequest: req}, agent.ExecIO{}); err == nil {
		t.Fatal("exec stream with a credential that does not open: no error")
	}
	if _, err := h.d.Start(ctx, id, ExecOptions{ExecRequest: req}); err == nil {
		t.Fatal("start with a credential that does not open: no error")
	}
	if evs := h.events(id); slices.Contains(evs, store.EventExecStarted) {
		t.Errorf("ledger %v: exec.started for execs that never started", evs)
	}
	// The pty slot went back: 16 more sessions may open.
	if n := h.d.act().ptys[id]; n != 0 {
		t.Errorf("%d pty slots held after failed starts", n)
	}
}
