package e2e

import (
	"context"
	"database/sql"
	"path/filepath"
	"strings"
	"testing"

	_ "modernc.org/sqlite"

	"github.com/forkbox/forkbox/client"
)

// agentToken reads a sandbox's agent token from the daemon's database
// (read-only).
func agentToken(t *testing.T, id string) string {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+filepath.Join(env.stateDir, "forkbox.db")+"?mode=ro&_pragma=busy_timeout(5000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var tok string
	if err := db.QueryRow(`SELECT agent_token FROM sandboxes WHERE id = ?`, id).Scan(&tok); err != nil {
		t.Fatalf("agent token of %s: %v", id, err)
	}
	if tok == "" {
		t.Fatalf("sandbox %s has no agent token", id)
	}
	return tok
}

// TestAgentTokenNotReadableInside: the agent's token is in no file or
// environment a tenant can read: not in /proc/1/environ (read by an exec'd
// process or through the file API), not in an exec's environment.
func TestAgentTokenNotReadableInside(t *testing.T) {
	forEachRuntime(t, func(t *testing.T) {
		ctx := context.Background()
		sb := newSandbox(t, clientOpts())
		tok := agentToken(t, sb.ID)
		for _, cmd := range []string{"cat /proc/1/environ", "cat /proc/self/environ", "env", "cat /proc/1/cmdline"} {
			out, errs, res := sh(t, sb, cmd+" 2>&1")
			if strings.Contains(out+errs, tok) {
				t.Errorf("%q shows the agent token", cmd)
			}
			t.Logf("%s: exit %d, %d bytes", cmd, res.ExitCode, len(out))
		}
		b, err := sb.ReadFile(ctx, "/proc/1/environ")
		t.Logf("file API read of /proc/1/environ: %d bytes, %v", len(b), err)
		if strings.Contains(string(b), tok) {
			t.Errorf("a file-API read of /proc/1/environ shows the agent token")
		}
		if !strings.Contains(string(b), "FORKBOX_AGENT_ADDR") && err == nil {
			t.Logf("environ: %q", b)
		}
	})
}

// TestMemoryForkTokensDiffer: after a memory fork the source (restored in
// place) and every child answer with tokens of their own, none the
// source's old one (which every child's memory held when it woke).
func TestMemoryForkTokensDiffer(t *testing.T) {
	ctx := context.Background()
	src := newSandbox(t, clientOpts())
	before := agentToken(t, src.ID)
	res, err := src.Fork(ctx, client.ForkOptions{Count: 2, Memory: true})
	if err != nil {
		t.Fatal(err)
	}
	kids := res.Sandboxes()
	closeAll(t, kids)
	if len(kids) != 2 {
		t.Fatalf("memory fork: %d children: %+v", len(kids), res.Children)
	}
	seen := map[string]string{before: "the source before the fork"}
	check := func(who string, sb *client.Sandbox) {
		tok := agentToken(t, sb.ID)
		if prev, ok := seen[tok]; ok {
			t.Errorf("%s has the same agent token as %s", who, prev)
		}
		seen[tok] = who
		if got := mustSh(t, sb, "echo ok"); got != "ok\n" {
			t.Errorf("%s after the fork: %q", who, got)
		}
	}
	check("the source after the fork", src)
	for i, k := range kids {
		check("child "+string(rune('0'+i)), k)
	}
}
