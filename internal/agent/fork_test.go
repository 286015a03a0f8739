package agent

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/forkbox/forkbox/errdefs"
)

// writeHook writes an executable shell script into dir and returns its path.
func writeHook(t *testing.T, dir, name, script string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"+script+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestForkedSwapsToken(t *testing.T) {
	c := startServer(t, Config{ForkHooks: []string{}})
	ctx := testCtx(t)
	old := NewClient(c.addr, testToken)

	// An exec authenticated with the old token keeps running across the swap.
	type execOut struct {
		out string
		err error
	}
	// It waits for a line of input that comes after the swap; the swap
	// comes once it started.
	inflight := make(chan execOut, 1)
	started := make(chan struct{})
	stdinR, stdinW := io.Pipe()
	go func() {
		var out bytes.Buffer
		_, err := old.ExecStream(ctx, ExecRequest{Shell: "read x; echo still-$x"}, ExecIO{Stdin: stdinR, Stdout: &out,
			Started: func(int) { close(started) }})
		inflight <- execOut{out.String(), err}
	}()
	select {
	case <-started:
	case r := <-inflight:
		t.Fatalf("in-flight exec ended before the swap: %q, %v", r.out, r.err)
	}

	daemonTime := time.Now().Add(time.Hour)
	reply, err := c.Forked(ctx, ForkNotice{Token: "child-token", Reason: ForkReasonFork,
		Hostname: "child-1", MachineID: "m1", ParentID: "parent", Time: daemonTime})
	if err != nil {
		t.Fatal(err)
	}
	if reply.HookRan {
		t.Errorf("got HookRan with no hook paths, want false")
	}
	// The notice's time was an hour ahead when sent; the skew is smaller
	// by the time it took to arrive (seconds at most on a loaded host).
	if d := reply.ClockSkew - time.Hour; d > time.Second || d < -20*time.Second {
		t.Errorf("got clock skew %v, want about 1h", reply.ClockSkew)
	}
	if _, err := io.WriteString(stdinW, "here\n"); err != nil {
		t.Fatalf("input to the in-flight exec: %v", err)
	}
	stdinW.Close()
	if r := <-inflight; r.err != nil || r.out != "still-here\n" {
		t.Errorf("in-flight exec: got %q, %v; want %q, nil", r.out, r.err, "still-here\n")
	}

	if _, err := old.Ping(ctx); !errdefs.IsUnauthenticated(err) {
		t.Errorf("Ping with the old token: got %v, want Unauthenticated", err)
	}
	if _, err := old.Forked(ctx, ForkNotice{Token: "evil", Reason: ForkReasonFork}); !errdefs.IsUnauthenticated(err) {
		t.Errorf("Forked with the old token: got %v, want Unauthenticated", err)
	}
	// c switched to the new token; so does a fresh client holding it.
	if _, err := c.Ping(ctx); err != nil {
		t.Errorf("Ping through the forked client: %v", err)
	}
	fresh := NewClient(c.addr, "child-token")
	var out bytes.Buffer
	res, err := fresh.Exec(ctx, ExecRequest{Shell: "echo ok"}, &out, nil)
	if err != nil || res.ExitCode != 0 || out.String() != "ok\n" {
		t.Errorf("exec after the swap: got %+v %q %v, want exit 0 %q", res, out.String(), err, "ok\n")
	}
	if pid, err := fresh.Start(ctx, ExecRequest{Shell: "true"}); err != nil || pid <= 0 {
		t.Errorf("start after the swap: got %d, %v", pid, err)
	}

	// A wake without a token keeps the current one.
	if _, err := fresh.Forked(ctx, ForkNotice{Reason: ForkReasonWake, Time: time.Now()}); err != nil {
		t.Fatalf("wake: %v", err)
	}
	if _, err := fresh.Ping(ctx); err != nil {
		t.Errorf("Ping after a wake without a token: %v", err)
	}
}

func TestForkedInvalid(t *testing.T) {
	c := startServer(t, Config{ForkHooks: []string{}})
	ctx := testCtx(t)
	for _, tc := range []struct {
		name string
		n    ForkNotice
	}{
		{"no reason", ForkNotice{Token: "x"}},
		{"bad reason", ForkNotice{Token: "x", Reason: "clone"}},
		{"fork without token", ForkNotice{Reason: ForkReasonFork}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := c.Forked(ctx, tc.n); !errdefs.IsInvalidArgument(err) {
				t.Errorf("got %v, want InvalidArgument", err)
			}
		})
	}
	if _, err := NewClient(c.addr, testToken).Ping(ctx); err != nil {
		t.Errorf("a refused notice changed the token: %v", err)
	}
}

func TestForkedHook(t *testing.T) {
	dir := t.TempDir()
	notExec := filepath.Join(dir, "not-exec")
	if err := os.WriteFile(notExec, []byte("#!/bin/sh\necho wrong\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	hook := writeHook(t, dir, "on-fork", `echo "$FORKBOX_FORK_REASON $FORKBOX_PARENT_ID $FORKBOX_MACHINE_ID $HOSTNAME"; echo to-stderr >&2; env | grep -c FORKBOX_AGENT || true`)
	second := writeHook(t, dir, "second", "echo second")
	c := startServer(t, Config{
		ForkHooks: []string{filepath.Join(dir, "missing"), dir, notExec, hook, second},
		Env:       []string{"FORKBOX_AGENT_TOKEN=leak"},
	})
	ctx := testCtx(t)
	reply, err := c.Forked(ctx, ForkNotice{Token: "t2", Reason: ForkReasonFork,
		Hostname: "child-host", MachineID: "mid", ParentID: "pid-1", Time: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	want := "fork pid-1 mid child-host\nto-stderr\n0\n"
	if !reply.HookRan || reply.HookExitCode != 0 || reply.HookOutput != want {
		t.Errorf("got %+v, want hook ran, exit 0, output %q", reply, want)
	}
	// A wake runs the hook again, with the reason "wake".
	reply, err = c.Forked(ctx, ForkNotice{Reason: ForkReasonWake})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(reply.HookOutput, "wake ") {
		t.Errorf("wake: got hook output %q, want it to start with %q", reply.HookOutput, "wake ")
	}
}

func TestForkedHookFails(t *testing.T) {
	dir := t.TempDir()
	hook := writeHook(t, dir, "on-fork", "seq 1 5000; echo tail-marker >&2; exit 7")
	c := startServer(t, Config{ForkHooks: []string{hook}})
	ctx := testCtx(t)
	reply, err := c.Forked(ctx, ForkNotice{Token: "t2", Reason: ForkReasonFork})
	if err != nil {
		t.Fatalf("a failing hook must not fail Forked: %v", err)
	}
	if !reply.HookRan || reply.HookExitCode != 7 {
		t.Errorf("got HookRan %v exit %d, want true, 7", reply.HookRan, reply.HookExitCode)
	}
	if len(reply.HookOutput) > MaxHookOutput || !strings.HasSuffix(reply.HookOutput, "4999\n5000\ntail-marker\n") {
		t.Errorf("got %d bytes of output ending %q, want at most %d ending with the hook's last lines",
			len(reply.HookOutput), reply.HookOutput[max(0, len(reply.HookOutput)-40):], MaxHookOutput)
	}
	// The token was swapped even though the hook failed.
	if _, err := NewClient(c.addr, "t2").Ping(ctx); err != nil {
		t.Errorf("Ping with the new token: %v", err)
	}
}

func TestForkedHookTimeout(t *testing.T) {
	dir := t.TempDir()
	hook := writeHook(t, dir, "on-fork", "echo started; sleep 30 & sleep 30")
	c := startServer(t, Config{ForkHooks: []string{hook}, ForkHookTimeout: 3 * time.Second})
	ctx := testCtx(t)
	start := time.Now()
	reply, err := c.Forked(ctx, ForkNotice{Token: "t2", Reason: ForkReasonFork})
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 20*time.Second {
		t.Errorf("Forked took %v: the 3 s hook timeout waited for the hook's 30 s sleeps", d)
	}
	if !reply.HookRan || reply.HookExitCode != 137 ||
		!strings.HasPrefix(reply.HookOutput, "started\n") || !strings.Contains(reply.HookOutput, "killed after 3s") {
		t.Errorf("got %+v, want exit 137 and output saying the hook was killed", reply)
	}
}

func TestForkedMissingHook(t *testing.T) {
	dir := t.TempDir()
	c := startServer(t, Config{ForkHooks: []string{filepath.Join(dir, "on-fork"), filepath.Join(dir, "also-missing")}})
	reply, err := c.Forked(testCtx(t), ForkNotice{Token: "t2", Reason: ForkReasonFork})
	if err != nil {
		t.Fatal(err)
	}
	if reply.HookRan || reply.HookExitCode != 0 || reply.HookOutput != "" {
		t.Errorf("got %+v, want the hook not run", reply)
	}
}

func TestTailWriter(t *testing.T) {
	for _, tc := range []struct {
		name   string
		writes []string
		max    int
		want   string
	}{
		{"short", []string{"ab", "cd"}, 8, "abcd"},
		{"cut", []string{"0123456789", "abcdef"}, 4, "cdef"},
		{"many writes", []string{"aaaa", "bbbb", "cccc", "dddd", "ee"}, 5, "ddddee"[1:]},
		{"rune boundary", []string{"xé€"}, 4, "€"}, // "é" would be cut in half
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := &tailWriter{max: tc.max}
			for _, s := range tc.writes {
				w.Write([]byte(s))
			}
			if got := w.String(); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}
