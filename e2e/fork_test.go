package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/errdefs"
)

func closeAll(t *testing.T, sbs []*client.Sandbox) {
	t.Cleanup(func() {
		for _, sb := range sbs {
			sb.Close(context.Background())
		}
	})
}

func TestForkContract(t *testing.T) {
	forEachRuntime(t, func(t *testing.T) {
		ctx := context.Background()
		o := clientOpts()
		o.Name = "parent"
		o.Env = map[string]string{"STAGE": "parent"}
		o.Cwd = "/root"
		src := newSandbox(t, o)
		// Written just before the fork, with no sync: the fork must see it all.
		mustSh(t, src, "echo base > /root/base.txt; dd if=/dev/urandom of=/root/blob bs=1M count=8 2>/dev/null; md5sum /root/blob > /root/blob.md5")
		res, err := src.Fork(ctx, client.ForkOptions{Tag: "after-setup", Count: 3})
		if err != nil {
			t.Fatal(err)
		}
		if res.Captured != "filesystem" || res.Checkpoint.GetTag() != "after-setup" || res.Checkpoint.Kind != "filesystem" {
			t.Errorf("fork response: captured %q, checkpoint %+v", res.Captured, res.Checkpoint)
		}
		if res.CaptureMS <= 0 || res.TotalMS < res.CaptureMS {
			t.Errorf("fork timings: capture %.1f ms, total %.1f ms", res.CaptureMS, res.TotalMS)
		}
		kids := res.Sandboxes()
		closeAll(t, kids)
		if len(kids) != 3 {
			t.Fatalf("got %d children: %+v", len(kids), res.Children)
		}
		// The source keeps running and writes after the fork.
		mustSh(t, src, "echo later > /root/after-fork.txt; echo parent-change >> /root/base.txt")

		seen := map[string]map[string]bool{}
		note := func(field, v string) {
			if seen[field] == nil {
				seen[field] = map[string]bool{}
			}
			if seen[field][v] {
				t.Errorf("two sandboxes share %s %q", field, v)
			}
			seen[field][v] = true
		}
		srcMachineID := strings.TrimSpace(mustSh(t, src, "cat /etc/machine-id"))
		note("machine-id", srcMachineID)
		note("ip", src.Info.Ip)
		note("hostname", "parent")
		for i, k := range kids {
			if c := res.Children[i]; c.StartMS <= 0 {
				t.Errorf("child %d: start_ms %.1f", i, c.StartMS)
			}
			if !strings.HasPrefix(k.Info.Name, "fork-parent-") || k.Info.ParentId != src.ID || k.Info.FromCheckpoint != res.Checkpoint.Id {
				t.Errorf("child %d: name %q parent %q from %q", i, k.Info.Name, k.Info.ParentId, k.Info.FromCheckpoint)
			}
			if out := mustSh(t, k, "cat /root/base.txt; md5sum -c /root/blob.md5 >/dev/null && echo blob-ok; test -e /root/after-fork.txt && echo LEAK; echo $STAGE; pwd"); out != "base\nblob-ok\nparent\n/root\n" {
				t.Errorf("child %d sees %q", i, out)
			}
			host := strings.TrimSpace(mustSh(t, k, "hostname"))
			if host != k.Info.Name {
				t.Errorf("child %d hostname %q, want %q", i, host, k.Info.Name)
			}
			note("hostname", host)
			note("machine-id", strings.TrimSpace(mustSh(t, k, "cat /etc/machine-id")))
			note("ip", k.Info.Ip)
			note("id", k.ID)
			mustSh(t, k, fmt.Sprintf("echo child-%d > /root/mine.txt", i))
		}
		// Children's writes diverge: each sees only its own.
		for i, k := range kids {
			if out := mustSh(t, k, "cat /root/mine.txt"); out != fmt.Sprintf("child-%d\n", i) {
				t.Errorf("child %d: mine.txt = %q", i, out)
			}
		}
		if _, _, r := sh(t, src, "cat /root/mine.txt"); r.ExitCode == 0 {
			t.Errorf("a child's write is visible in the source")
		}
		// The fork is in the source's ledger and its checkpoints.
		cks, err := src.ListCheckpoints(ctx)
		if err != nil || len(cks) != 1 || cks[0].Id != res.Checkpoint.Id || cks[0].Size <= 8<<20 {
			t.Errorf("ListCheckpoints = %+v, %v", cks, err)
		}
		evs, _ := src.Events(ctx)
		if !hasEvent(evs, "sandbox.checkpoint_created") || !hasEvent(evs, "sandbox.forked") {
			t.Errorf("source ledger: %v", types(evs))
		}
		// Children inherit resources and take overrides.
		over, err := src.Fork(ctx, client.ForkOptions{Overrides: client.Overrides{Env: map[string]string{"STAGE": "child"},
			Resources: client.Resources{CPU: "0.5"}, Name: "custom-child"}})
		if err != nil || over.Children[0].Err != nil {
			t.Fatalf("fork with overrides: %v %+v", err, over)
		}
		oc := over.Children[0].Sandbox
		closeAll(t, []*client.Sandbox{oc})
		if out := mustSh(t, oc, "echo $STAGE; cat /root/after-fork.txt"); out != "child\nlater\n" || oc.Info.Name != "custom-child" || oc.Info.Resources.Cpu != "0.5" {
			t.Errorf("override child: %q, %+v", out, oc.Info)
		}
		checkCgroupLimits(t, oc.ID, 50000, 1024)
	})
}

func TestForkNoSilentFallback(t *testing.T) {
	ctx := context.Background()
	sb, err := env.c.CreateSandbox(ctx, clientOpts())
	if err != nil {
		t.Fatal(err)
	}
	mustSh(t, sb, "echo kept > /root/kept")
	ck, err := sb.Checkpoint(ctx, "before-close")
	if err != nil {
		t.Fatal(err)
	}
	sb.Close(ctx)
	before := countSandboxes(t)
	if _, err := sb.Fork(ctx, client.ForkOptions{}); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("fork of a closed sandbox: got %v, want FailedPrecondition", err)
	}
	if _, err := env.c.Resume(ctx, "sb-000000000000"); !errdefs.IsNotFound(err) {
		t.Errorf("resume of an unknown session: %v", err)
	}
	if n := countSandboxes(t); n != before {
		t.Errorf("a failed fork created sandboxes: %d -> %d", before, n)
	}
	// The checkpoint outlives its sandbox and can be forked or restored.
	res, err := sb.Fork(ctx, client.ForkOptions{FromCheckpoint: ck.Id})
	if err != nil || res.Children[0].Err != nil {
		t.Fatalf("fork from the checkpoint of a closed sandbox: %v %+v", err, res)
	}
	closeAll(t, res.Sandboxes())
	if out := mustSh(t, res.Children[0].Sandbox, "cat /root/kept"); out != "kept\n" {
		t.Errorf("child of the checkpoint sees %q", out)
	}
	// A sandbox with no checkpoint cannot be resumed: no fresh create.
	bare, err := env.c.CreateSandbox(ctx, clientOpts())
	if err != nil {
		t.Fatal(err)
	}
	bare.Close(ctx)
	if _, err := env.c.Resume(ctx, bare.ID); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("resume with no checkpoint: got %v, want FailedPrecondition", err)
	}
	if err := env.c.DeleteCheckpoint(ctx, ck.Id); err != nil {
		t.Fatal(err)
	}
	if _, err := env.c.RestoreSnapshot(ctx, ck.Id, client.Overrides{}, nil); !errdefs.IsNotFound(err) {
		t.Errorf("restore of a deleted checkpoint: got %v", err)
	}
	if _, err := sb.Fork(ctx, client.ForkOptions{Count: 101}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("count 101: got %v", err)
	}
}

func TestForkOfPausedSandbox(t *testing.T) {
	forEachRuntime(t, func(t *testing.T) {
		ctx := context.Background()
		src := newSandbox(t, clientOpts())
		mustSh(t, src, "echo paused-state > /root/p")
		if err := src.Pause(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := src.Exec(ctx, client.ExecOptions{Shell: "true"}); !errdefs.IsFailedPrecondition(err) {
			t.Errorf("exec on a paused sandbox: got %v, want FailedPrecondition", err)
		}
		res, err := src.Fork(ctx, client.ForkOptions{Tag: "while-paused"})
		if err != nil || res.Children[0].Err != nil {
			t.Fatalf("fork of a paused sandbox: %v %+v", err, res)
		}
		closeAll(t, res.Sandboxes())
		if out := mustSh(t, res.Children[0].Sandbox, "cat /root/p"); out != "paused-state\n" {
			t.Errorf("child of a paused sandbox sees %q", out)
		}
		if err := src.Refresh(ctx); err != nil || src.Info.State != "paused" {
			t.Errorf("source after the fork: %q %v; want still paused", src.Info.GetState(), err)
		}
		if err := src.Unpause(ctx); err != nil {
			t.Fatal(err)
		}
		mustSh(t, src, "true")
	})
}

func TestCredentials(t *testing.T) {
	ctx := context.Background()
	src := newSandbox(t, clientOpts())
	const shared, mine = "shared-Secret-Value-123", "per-fork-Secret-456"
	if err := src.Credentials().Set(ctx, "API_TOKEN", shared, client.CredentialOptions{Env: "API_TOKEN", File: "api_token"}); err != nil {
		t.Fatal(err)
	}
	if err := src.Credentials().Set(ctx, "session", mine, client.CredentialOptions{Env: "SESSION", PerFork: true}); err != nil {
		t.Fatal(err)
	}
	if out := mustSh(t, src, "echo $API_TOKEN; cat /run/secrets/api_token; echo; echo $SESSION"); out != shared+"\n"+shared+"\n"+mine+"\n" {
		t.Errorf("source sees %q", out)
	}
	// A per-fork credential must be supplied.
	if _, err := src.Fork(ctx, client.ForkOptions{}); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("fork without the per-fork credential: got %v", err)
	}
	res, err := src.Fork(ctx, client.ForkOptions{Credentials: map[string]string{"session": "child-session-789"}})
	if err != nil || res.Children[0].Err != nil {
		t.Fatalf("fork: %v %+v", err, res)
	}
	kid := res.Children[0].Sandbox
	closeAll(t, []*client.Sandbox{kid})
	if out := mustSh(t, kid, "echo $API_TOKEN; cat /run/secrets/api_token; echo; echo $SESSION"); out != shared+"\n"+shared+"\nchild-session-789\n" {
		t.Errorf("child sees %q", out)
	}
	// The CLI's restore takes a per-fork credential, which it needs.
	if _, stderr, code := cli(t, "restore", res.Checkpoint.Id); code == 0 || !strings.Contains(stderr, "per-fork") {
		t.Errorf("forkbox restore without the per-fork credential: exit %d, %q", code, stderr)
	}
	out, stderr, code := cli(t, "restore", res.Checkpoint.Id, "--credential", "session=cli-session-321")
	if code != 0 {
		t.Fatalf("forkbox restore --credential: exit %d, %q", code, stderr)
	}
	restored, err := env.c.Sandbox(ctx, strings.Fields(out)[0])
	if err != nil {
		t.Fatal(err)
	}
	closeAll(t, []*client.Sandbox{restored})
	if got := mustSh(t, restored, "echo $SESSION"); got != "cli-session-321\n" {
		t.Errorf("restored with --credential: $SESSION %q", got)
	}
	// The secret file is not in the snapshot: it lives on a tmpfs.
	if _, _, r := sh(t, kid, `grep -r "$API_TOKEN" /root /etc /tmp`); r.ExitCode == 0 {
		t.Errorf("the credential value is in the child's files")
	}
	// Names, never values, anywhere the daemon writes or answers.
	for _, sb := range []*client.Sandbox{src, kid} {
		if err := sb.Refresh(ctx); err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(sb.Info.Credentials) != "[API_TOKEN session]" {
			t.Errorf("inspect credentials = %v", sb.Info.Credentials)
		}
	}
	var dump strings.Builder
	for _, sb := range []*client.Sandbox{src, kid} {
		evs, _ := sb.Events(ctx)
		fmt.Fprint(&dump, evs)
		fmt.Fprint(&dump, sb.Info.String())
	}
	log, _ := os.ReadFile(env.logFile.Name())
	dump.Write(log)
	db, _ := os.ReadFile(filepath.Join(env.stateDir, "forkbox.db"))
	dump.Write(db)
	wal, _ := os.ReadFile(filepath.Join(env.stateDir, "forkbox.db-wal"))
	dump.Write(wal)
	for _, secret := range []string{shared, mine, "child-session-789", "cli-session-321"} {
		if strings.Contains(dump.String(), secret) {
			t.Errorf("credential value %q found in ledger, inspect, daemon log or database", secret)
		}
	}
	if !strings.Contains(dump.String(), "credentials.set") {
		t.Errorf("ledger has no credentials.set event")
	}
	if st, err := os.Stat(filepath.Join(env.stateDir, "credentials.key")); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("credentials key: %v %v", st.Mode(), err)
	}
}

func TestRestoreVersusResume(t *testing.T) {
	ctx := context.Background()
	o := clientOpts()
	o.Name = "session-x"
	sb, err := env.c.CreateSandbox(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	mustSh(t, sb, "echo setup > /root/log")
	ck, err := sb.Checkpoint(ctx, "setup-done")
	if err != nil {
		t.Fatal(err)
	}
	mustSh(t, sb, "echo step1 >> /root/log")
	if err := sb.WriteFile(ctx, "/root/notes", []byte("written by the API"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := sb.Exec(ctx, client.ExecOptions{Shell: "echo step2 >> /root/log; exit 4", Env: map[string]string{"X": "y"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := sb.Exec(ctx, client.ExecOptions{Shell: "echo side-effect >> /root/log", NonReplayable: true}); err != nil {
		t.Fatal(err)
	}
	// Simulated crash: the sandbox's runtime dies under the daemon.
	for _, p := range runscPids(sb.ID) {
		syscall.Kill(p, syscall.SIGKILL)
	}
	sb.Close(ctx)

	restored, err := env.c.RestoreSnapshot(ctx, ck.Id, client.Overrides{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	closeAll(t, []*client.Sandbox{restored})
	if out := mustSh(t, restored, "cat /root/log; test -e /root/notes && echo notes; true"); out != "setup\n" {
		t.Errorf("restore replays nothing; it sees %q", out)
	}
	revs, _ := restored.Events(ctx)
	if hasEvent(revs, "exec.replayed") {
		t.Errorf("restore replayed execs: %v", types(revs))
	}

	res, err := env.c.Resume(ctx, "session-x")
	if err != nil {
		t.Fatal(err)
	}
	closeAll(t, []*client.Sandbox{res.Sandbox})
	if res.Checkpoint.Id != ck.Id || res.Sandbox.Info.Name != "session-x" {
		t.Errorf("resume: checkpoint %s name %s", res.Checkpoint.Id, res.Sandbox.Info.Name)
	}
	if out := mustSh(t, res.Sandbox, "cat /root/log; cat /root/notes"); out != "setup\nstep1\nstep2\nwritten by the API" {
		t.Errorf("resume replays execs after the checkpoint in order; it sees %q", out)
	}
	var got []string
	for _, r := range res.Replayed {
		got = append(got, fmt.Sprintf("%s|%v|%d|%s", r.Shell, r.Skipped, r.ExitCode, r.SkipReason))
	}
	want := []string{"echo step1 >> /root/log|false|0|", "|false|0|", "echo step2 >> /root/log; exit 4|false|4|",
		"echo side-effect >> /root/log|true|0|marked non-replayable"}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("replayed:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestResumeTwice: a session resumed once, used and closed again, is
// resumed again, from the checkpoint its first resume started from, its
// execs since replayed in order (those replayed into it included): before,
// it had no checkpoint of its own and could not be. A fork child with no
// checkpoint of its own resumes from the fork's, with its own env.
func TestResumeTwice(t *testing.T) {
	ctx := context.Background()
	o := clientOpts()
	o.Name = "twice"
	sb, err := env.c.CreateSandbox(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	mustSh(t, sb, "echo one >> /root/log")
	if _, err := sb.Checkpoint(ctx, "base"); err != nil {
		t.Fatal(err)
	}
	mustSh(t, sb, "echo two >> /root/log")
	if err := sb.Close(ctx); err != nil {
		t.Fatal(err)
	}
	for i, line := range []string{"three", "four"} {
		res, err := env.c.Resume(ctx, "twice")
		if err != nil {
			t.Fatalf("resume %d: %v", i+1, err)
		}
		mustSh(t, res.Sandbox, "echo "+line+" >> /root/log")
		if err := res.Sandbox.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
	res, err := env.c.Resume(ctx, "twice")
	if err != nil {
		t.Fatalf("resume 3: %v", err)
	}
	closeAll(t, []*client.Sandbox{res.Sandbox})
	if got := mustSh(t, res.Sandbox, "cat /root/log"); got != "one\ntwo\nthree\nfour\n" {
		t.Errorf("after three resumes: %q", got)
	}

	fr, err := res.Sandbox.Fork(ctx, client.ForkOptions{Overrides: client.Overrides{Name: "twice-kid", Env: map[string]string{"KID": "yes"}}})
	if err != nil || fr.Children[0].Err != nil {
		t.Fatalf("fork: %v %+v", err, fr)
	}
	kid := fr.Children[0].Sandbox
	mustSh(t, kid, "echo kid >> /root/log")
	if err := kid.Close(ctx); err != nil {
		t.Fatal(err)
	}
	kr, err := env.c.Resume(ctx, "twice-kid")
	if err != nil {
		t.Fatalf("resume of a fork child: %v", err)
	}
	closeAll(t, []*client.Sandbox{kr.Sandbox})
	if got := mustSh(t, kr.Sandbox, "cat /root/log; echo $KID"); got != "one\ntwo\nthree\nfour\nkid\nyes\n" {
		t.Errorf("resumed fork child: %q", got)
	}
}

func TestClientMaxConcurrency(t *testing.T) {
	ctx := context.Background()
	c := &client.Client{Socket: env.socket, MaxConcurrency: 3}
	sb, err := c.CreateSandbox(ctx, clientOpts())
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close(ctx)
	before := countSandboxes(t)
	if _, err := sb.Fork(ctx, client.ForkOptions{Count: 3}); !errdefs.IsResourceExhausted(err) {
		t.Errorf("fork of 3 with 2 free slots: got %v", err)
	}
	if n := countSandboxes(t); n != before {
		t.Errorf("refused fork created sandboxes")
	}
	res, err := sb.Fork(ctx, client.ForkOptions{Count: 2})
	if err != nil {
		t.Fatalf("fork of 2 with 2 free slots: %v", err)
	}
	kids := res.Sandboxes()
	if _, err := c.CreateSandbox(ctx, clientOpts()); !errdefs.IsResourceExhausted(err) {
		t.Errorf("create beyond MaxConcurrency: got %v", err)
	}
	kids[0].Close(ctx)
	extra, err := c.CreateSandbox(ctx, clientOpts())
	if err != nil {
		t.Errorf("create after a close freed a slot: %v", err)
	} else {
		extra.Close(ctx)
	}
	kids[1].Close(ctx)
}

func TestCheckpointRetention(t *testing.T) {
	ctx := context.Background()
	withDaemonFlags(t, "--checkpoint-retention", "2s")
	live := newSandbox(t, clientOpts())
	keep, err := live.Checkpoint(ctx, "of-a-live-sandbox")
	if err != nil {
		t.Fatal(err)
	}
	gone, err := env.c.CreateSandbox(ctx, clientOpts())
	if err != nil {
		t.Fatal(err)
	}
	old, err := gone.Checkpoint(ctx, "of-a-closed-sandbox")
	if err != nil {
		t.Fatal(err)
	}
	gone.Close(ctx)
	// The retention looks every second; 60 s only guards against a hang.
	deadline := time.Now().Add(60 * time.Second)
	for {
		cks, err := gone.ListCheckpoints(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(cks) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the expired checkpoint of a closed sandbox is still listed after 60 s: %v", cks)
		}
		time.Sleep(100 * time.Millisecond) // a poll interval
	}
	if _, err := env.c.RestoreSnapshot(ctx, old.Id, client.Overrides{}, nil); !errdefs.IsNotFound(err) {
		t.Errorf("restore of an expired checkpoint: got %v, want NotFound", err)
	}
	if cks, _ := live.ListCheckpoints(ctx); len(cks) != 1 || cks[0].Id != keep.Id {
		t.Errorf("the checkpoint of a live sandbox was expired: %v", cks)
	}
}

// TestCredentialFilesFollowTheRecord: /run/secrets holds a sandbox's file
// credentials and nothing else. A credential replaced with another file,
// or with none, loses its old file. A sandbox restored from a memory
// checkpoint, or memory-forked, gets its own credentials' files, not the
// source's tmpfs as it was at the capture: before, a removed secret stayed
// readable there, with no record left to remove it by.
func TestCredentialFilesFollowTheRecord(t *testing.T) {
	ctx := context.Background()
	sb := newSandbox(t, gvisorOpts())
	set := func(name, value string, co client.CredentialOptions) {
		t.Helper()
		if err := sb.Credentials().Set(ctx, name, value, co); err != nil {
			t.Fatal(err)
		}
	}
	secrets := func(s *client.Sandbox) string {
		t.Helper()
		return strings.TrimSpace(mustSh(t, s, "cd /run/secrets && for f in *; do [ -e \"$f\" ] && echo \"$f=$(cat \"$f\")\"; done; true"))
	}
	set("A", "a-one", client.CredentialOptions{File: "a1"})
	set("X", "x-old", client.CredentialOptions{File: "x"})
	set("A", "a-two", client.CredentialOptions{File: "a2"})
	if got := secrets(sb); got != "a2=a-two\nx=x-old" {
		t.Errorf("after A moved to file a2: %q", got)
	}
	set("A", "a-env", client.CredentialOptions{Env: "A"})
	if got := secrets(sb); got != "x=x-old" {
		t.Errorf("after A became env only: %q", got)
	}
	ck, err := sb.CheckpointMemory(ctx, "with-x")
	if err != nil {
		t.Fatal(err)
	}
	if err := sb.Credentials().Delete(ctx, "X"); err != nil {
		t.Fatal(err)
	}
	set("Y", "y-new", client.CredentialOptions{File: "y"})
	restored, err := env.c.RestoreSnapshot(ctx, ck.Id, client.Overrides{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	closeAll(t, []*client.Sandbox{restored})
	res, err := sb.Fork(ctx, client.ForkOptions{Count: 1, Memory: true})
	if err != nil || res.Children[0].Err != nil {
		t.Fatalf("memory fork: %v %+v", err, res)
	}
	kid := res.Children[0].Sandbox
	closeAll(t, []*client.Sandbox{kid})
	for name, s := range map[string]*client.Sandbox{"source": sb, "restored": restored, "memory child": kid} {
		if got := secrets(s); got != "y=y-new" {
			t.Errorf("%s's /run/secrets: %q, want y=y-new alone", name, got)
		}
		if got := mustSh(t, s, "echo $A"); got != "a-env\n" {
			t.Errorf("%s's $A: %q", name, got)
		}
	}
}

// TestMemoryChildEnv: env given to a memory fork's child, or to a restore
// of a memory checkpoint, reaches its execs (fork contract: what the fork
// call gives overrides what is inherited). The restored agent holds the
// source's env, so before, execs saw the source's values and none of the
// new ones, while inspect showed the child's.
func TestMemoryChildEnv(t *testing.T) {
	ctx := context.Background()
	o := gvisorOpts()
	o.Env = map[string]string{"A": "1", "B": "2"}
	src := newSandbox(t, o)
	res, err := src.Fork(ctx, client.ForkOptions{Count: 1, Memory: true, Overrides: client.Overrides{Env: map[string]string{"B": "3", "C": "4"}}})
	if err != nil || res.Children[0].Err != nil {
		t.Fatalf("memory fork: %v %+v", err, res)
	}
	kid := res.Children[0].Sandbox
	closeAll(t, []*client.Sandbox{kid})
	restored, err := env.c.RestoreSnapshot(ctx, res.Checkpoint.Id, client.Overrides{Env: map[string]string{"C": "5"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	closeAll(t, []*client.Sandbox{restored})
	for _, c := range []struct {
		name string
		sb   *client.Sandbox
		want string
	}{{"source", src, "1 2\n"}, {"memory child", kid, "1 3 4\n"}, {"restored", restored, "1 2 5\n"}} {
		if got := mustSh(t, c.sb, "echo $A $B $C"); got != c.want {
			t.Errorf("%s: $A $B $C = %q, want %q", c.name, got, c.want)
		}
	}
}

// TestResumeKeepsCredentials: resume brings back the same session, so its
// credentials (per-fork ones too) come back as they were.
func TestResumeKeepsCredentials(t *testing.T) {
	ctx := context.Background()
	o := clientOpts()
	o.Name = "cred-session"
	sb, err := env.c.CreateSandbox(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	if err := sb.Credentials().Set(ctx, "session", "per-fork-value", client.CredentialOptions{Env: "SESSION", PerFork: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := sb.Checkpoint(ctx, "c"); err != nil {
		t.Fatal(err)
	}
	sb.Close(ctx)
	res, err := env.c.Resume(ctx, "cred-session")
	if err != nil {
		t.Fatalf("resume of a session with a per-fork credential: %v", err)
	}
	closeAll(t, []*client.Sandbox{res.Sandbox})
	if out := mustSh(t, res.Sandbox, "echo $SESSION"); out != "per-fork-value\n" {
		t.Errorf("resumed session's credential: %q", out)
	}
}
