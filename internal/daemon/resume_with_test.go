package daemon

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/forkbox/forkbox/internal/agent"
	"github.com/forkbox/forkbox/internal/store"
)

// ResumeWith names the new sandbox as asked, resumes from the session's
// last checkpoint and replays what came after it; the new sandbox's own
// ledger says what was replayed, command included (cluster mode reports
// a resume from it).
func TestResumeWithName(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	id := h.create(CreateOptions{Name: "session"})
	out := filepath.Join(t.TempDir(), "out") // the fake host's agent runs on the host
	run := func(word string) {
		t.Helper()
		res, err := h.d.Exec(ctx, id, ExecOptions{ExecRequest: agent.ExecRequest{Shell: "echo " + word + ` >> "$OUT"`, Env: map[string]string{"OUT": out}}}, nil, nil)
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("exec: %+v, %v", res, err)
		}
	}
	if _, err := h.d.Checkpoint(ctx, id, "first"); err != nil {
		t.Fatal(err)
	}
	run("one")
	last, err := h.d.Checkpoint(ctx, id, "second")
	if err != nil {
		t.Fatal(err)
	}
	run("two")
	if err := h.d.Delete(ctx, id); err != nil {
		t.Fatal(err)
	}
	os.Remove(out)
	sb, ck, replayed, err := h.d.ResumeWith(ctx, "session", ResumeOptions{Name: "k8s-new"})
	if err != nil {
		t.Fatal(err)
	}
	defer h.d.Delete(ctx, sb.ID)
	if sb.Name != "k8s-new" || ck.ID != last.ID {
		t.Fatalf("resumed as %q from %s; want k8s-new from %s", sb.Name, ck.ID, last.ID)
	}
	if len(replayed) != 1 {
		t.Fatalf("replayed %d execs, want the 1 after the last checkpoint: %+v", len(replayed), replayed)
	}
	if b, err := os.ReadFile(out); err != nil || string(b) != "two\n" {
		t.Fatalf("replay wrote %q, %v", b, err)
	}
	evs, err := h.d.Events(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	var seen map[string]any
	for _, e := range evs {
		if e.Type == store.EventExecReplayed {
			seen = e.Data
		}
	}
	if seen["exec_id"] != replayed[0].ExecID || seen["shell"] != `echo two >> "$OUT"` || seen["exit_code"] != float64(0) {
		t.Fatalf("the new sandbox's ledger says it replayed %v; want %s with its command", seen, replayed[0].ExecID)
	}
}
