package agent

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/forkbox/forkbox/errdefs"
)

// TestMain lets the test binary act as the agent's helper and as a process
// whose environment holds a token.
func TestMain(m *testing.M) {
	switch os.Getenv("FORKBOX_TEST_ROLE") {
	case "environ":
		// Take the token as the agent does, then show what
		// /proc/self/environ holds.
		tok := takeEnv(EnvToken)
		b, _ := os.ReadFile("/proc/self/environ")
		os.Stdout.WriteString(tok + "\n")
		os.Stdout.Write(b)
		os.Exit(0)
	case "holdname":
		// In a UTS namespace of its own (holdname_test.go).
		holdnameChild()
		os.Exit(0)
	}
	if len(os.Args) > 1 && os.Args[1] == HelperExecLimited {
		err := ExecLimited(os.Args[2:])
		os.Stderr.WriteString(err.Error())
		os.Exit(127)
	}
	os.Exit(m.Run())
}

func TestTakeEnvErasesEnvironBlock(t *testing.T) {
	const secret = "tok-0123456789abcdef"
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), "FORKBOX_TEST_ROLE=environ", EnvToken+"="+secret)
	out, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	got, environ, _ := strings.Cut(string(out), "\n")
	if got != secret {
		t.Errorf("takeEnv: got %q, want %q", got, secret)
	}
	if strings.Contains(environ, secret) {
		t.Errorf("/proc/self/environ still holds the token: %q", environ)
	}
	if !strings.Contains(environ, "FORKBOX_TEST_ROLE=environ") {
		t.Errorf("/proc/self/environ lost other variables: %q", environ)
	}
}

func TestRotateToken(t *testing.T) {
	c := startServer(t, Config{})
	ctx := testCtx(t)
	old := NewClient(c.addr, testToken)
	if err := c.RotateToken(ctx, "new-token"); err != nil {
		t.Fatal(err)
	}
	// Until the new token is used, the old one still works (a daemon that
	// crashed before recording the new one can still reach the agent).
	if _, err := old.Ping(ctx); err != nil {
		t.Errorf("ping with the old token before the new one was used: %v", err)
	}
	if _, err := c.Ping(ctx); err != nil {
		t.Errorf("ping with the new token: %v", err)
	}
	if _, err := old.Ping(ctx); !errors.Is(err, errdefs.ErrUnauthenticated) {
		t.Errorf("ping with the old token after the new one was used: got %v, want Unauthenticated", err)
	}
	if err := old.RotateToken(ctx, "third"); !errors.Is(err, errdefs.ErrUnauthenticated) {
		t.Errorf("rotate with the old token: got %v, want Unauthenticated", err)
	}
}

// Every process the agent starts gets the pids limit as RLIMIT_NPROC, with
// the native helper (the default) and with the agent's Go helper mode.
func TestPidsLimitSetsRlimitNproc(t *testing.T) {
	for name, helper := range map[string]string{"native": "", "go": os.Args[0]} {
		t.Run(name, func(t *testing.T) {
			c := startServer(t, Config{PidsLimit: 37, Helper: helper})
			ctx := testCtx(t)
			var out bytes.Buffer
			res, err := c.Exec(context.WithoutCancel(ctx), ExecRequest{Argv: []string{"cat", "/proc/self/limits"}}, &out, nil)
			if err != nil || res.ExitCode != 0 {
				t.Fatalf("exec: %+v, %v", res, err)
			}
			for _, l := range strings.Split(out.String(), "\n") {
				if strings.HasPrefix(l, "Max processes") {
					if f := strings.Fields(l); len(f) < 4 || f[2] != "37" || f[3] != "37" {
						t.Errorf("got %q, want soft and hard 37", l)
					}
					return
				}
			}
			t.Errorf("no Max processes line in %q", out.String())
		})
	}
}
