package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/forkbox/forkbox/client"
)

// TestLedgerHidesExecSecrets: an exec's env values and stdin and a written
// file's content are not in the ledger in clear (not in the database file,
// not in the Events API, not in `forkbox logs`), and Resume still replays
// them.
func TestLedgerHidesExecSecrets(t *testing.T) {
	ctx := context.Background()
	const secret, stdin, content = "env-S3CR3T-4471", "stdin-S3CR3T-9902", "file-S3CR3T-3318"
	o := clientOpts()
	o.Name = "ledger-secrets"
	sb, err := env.c.CreateSandbox(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sb.Checkpoint(ctx, "clean"); err != nil {
		t.Fatal(err)
	}
	res, err := sb.Exec(ctx, client.ExecOptions{Shell: `printf %s "$SECRET" > /root/out; cat >> /root/out`,
		Env: map[string]string{"SECRET": secret}, Stdin: []byte(stdin)})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("exec: %+v, %v", res, err)
	}
	if err := sb.WriteFile(ctx, "/root/notes", []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}

	evs, err := sb.Events(ctx)
	if err != nil {
		t.Fatal(err)
	}
	apiJSON, _ := json.Marshal(evs)
	logs, err := exec.Command(env.bin, "--host", "unix://"+env.socket, "logs", "ledger-secrets").CombinedOutput()
	if err != nil {
		t.Fatalf("forkbox logs: %v: %s", err, logs)
	}
	var db []byte
	for _, f := range []string{"forkbox.db", "forkbox.db-wal"} {
		b, _ := os.ReadFile(filepath.Join(env.stateDir, f))
		db = append(db, b...)
	}
	if len(db) == 0 {
		t.Fatal("no database file found")
	}
	for where, b := range map[string][]byte{"Events API": apiJSON, "forkbox logs": logs, "database": db} {
		for _, s := range []string{secret, stdin, content} {
			if bytes.Contains(b, []byte(s)) {
				t.Errorf("%s holds %q in clear", where, s)
			}
		}
	}
	if !bytes.Contains(logs, []byte("SECRET")) || !bytes.Contains(logs, []byte("/root/notes")) {
		t.Errorf("forkbox logs should still name the env variable and the file:\n%s", logs)
	}

	// Simulated crash, then resume: the replay needs the sealed values.
	for _, p := range runscPids(sb.ID) {
		syscall.Kill(p, syscall.SIGKILL)
	}
	sb.Close(ctx)
	r, err := env.c.Resume(ctx, "ledger-secrets")
	if err != nil {
		t.Fatal(err)
	}
	closeAll(t, []*client.Sandbox{r.Sandbox})
	for _, rp := range r.Replayed {
		if rp.Skipped {
			t.Errorf("replay skipped %s: %s", rp.ExecId, rp.SkipReason)
		}
	}
	if out := mustSh(t, r.Sandbox, "cat /root/out; echo; cat /root/notes"); out != secret+stdin+"\n"+content {
		t.Errorf("resumed session sees %q", out)
	}
}
