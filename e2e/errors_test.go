package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/errdefs"
)

// TestBadInput: every bad request gets an error of the right class and
// changes nothing (no sandbox record, no host state).
func TestBadInput(t *testing.T) {
	ctx := context.Background()
	named := clientOpts()
	named.Name = "dup-name"
	sb := newSandbox(t, named)

	countBefore := countSandboxes(t)
	creates := []struct {
		name  string
		o     client.CreateOptions
		class func(error) bool
	}{
		{"unknown image", client.CreateOptions{Image: "no/such:image"}, errdefs.IsNotFound},
		{"no image", client.CreateOptions{}, errdefs.IsInvalidArgument},
		{"bad cpu", client.CreateOptions{Image: env.image, Resources: client.Resources{CPU: "lots"}}, errdefs.IsInvalidArgument},
		{"negative cpu", client.CreateOptions{Image: env.image, Resources: client.Resources{CPU: "-1"}}, errdefs.IsInvalidArgument},
		{"bad memory", client.CreateOptions{Image: env.image, Resources: client.Resources{Memory: "12XB"}}, errdefs.IsInvalidArgument},
		{"tiny memory", client.CreateOptions{Image: env.image, Resources: client.Resources{Memory: "1Mi"}}, errdefs.IsInvalidArgument},
		{"bad pids", client.CreateOptions{Image: env.image, Resources: client.Resources{Pids: 2}}, errdefs.IsInvalidArgument},
		{"bad egress", client.CreateOptions{Image: env.image, Egress: "some"}, errdefs.IsInvalidArgument},
		{"bad name", client.CreateOptions{Image: env.image, Name: "../etc"}, errdefs.IsInvalidArgument},
		{"bad env", client.CreateOptions{Image: env.image, Env: map[string]string{"A=B": "c"}}, errdefs.IsInvalidArgument},
		{"reserved env", client.CreateOptions{Image: env.image, Env: map[string]string{"FORKBOX_PIDS_LIMIT": "0"}}, errdefs.IsInvalidArgument},
		{"relative cwd", client.CreateOptions{Image: env.image, Cwd: "tmp"}, errdefs.IsInvalidArgument},
		{"unknown runtime", client.CreateOptions{Image: env.image, Runtime: "qemu"}, errdefs.IsInvalidArgument},
		{"duplicate name", named, errdefs.IsAlreadyExists},
	}
	for _, c := range creates {
		_, err := env.c.CreateSandbox(ctx, c.o)
		if !c.class(err) {
			t.Errorf("%s: got %v (%s)", c.name, err, errdefs.ClassName(err))
		}
	}
	if n := countSandboxes(t); n != countBefore {
		t.Errorf("bad creates changed the sandbox list: %d -> %d", countBefore, n)
	}

	if _, err := env.c.Sandbox(ctx, "sb-000000000000"); !errdefs.IsNotFound(err) {
		t.Errorf("unknown sandbox: got %v", err)
	}
	if _, err := env.c.Events(ctx, "nope"); !errdefs.IsNotFound(err) {
		t.Errorf("events of unknown sandbox: got %v", err)
	}
	files := []struct {
		path  string
		class func(error) bool
	}{
		{"/etc/../../../etc/passwd", errdefs.IsInvalidArgument},
		{"../../etc/passwd", errdefs.IsInvalidArgument},
		{"relative/path", errdefs.IsInvalidArgument},
		{"/etc/pass\x00wd", errdefs.IsInvalidArgument},
		{"/no/such/file", errdefs.IsNotFound},
	}
	for _, c := range files {
		if _, err := sb.ReadFile(ctx, c.path); !c.class(err) {
			t.Errorf("ReadFile(%q): got %v (%s)", c.path, err, errdefs.ClassName(err))
		}
		if c.path != "/no/such/file" {
			if err := sb.WriteFile(ctx, c.path, []byte("x"), 0); !c.class(err) {
				t.Errorf("WriteFile(%q): got %v (%s)", c.path, err, errdefs.ClassName(err))
			}
		}
	}
	if _, err := sb.ListFiles(ctx, "/tmp/../.."); !errdefs.IsInvalidArgument(err) {
		t.Errorf("ListFiles traversal: got %v", err)
	}
	// Oversized payloads.
	big := bytes.Repeat([]byte("x"), 40<<20)
	if err := sb.WriteFile(ctx, "/tmp/big", big, 0); !errdefs.IsResourceExhausted(err) {
		t.Errorf("40 MiB write: got %v (%s)", err, errdefs.ClassName(err))
	}
	if _, err := sb.Exec(ctx, client.ExecOptions{Shell: "cat", Stdin: big[:20<<20]}); !errdefs.IsResourceExhausted(err) {
		t.Errorf("20 MiB stdin: got %v (%s)", err, errdefs.ClassName(err))
	}
	if _, err := sb.Exec(ctx, client.ExecOptions{}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("empty exec: got %v", err)
	}
	if _, err := sb.Exec(ctx, client.ExecOptions{Argv: []string{"/no/such/binary"}}); !errdefs.IsNotFound(err) {
		t.Errorf("exec of a missing binary: got %v (%s)", err, errdefs.ClassName(err))
	}
	// A closed sandbox refuses exec with FailedPrecondition.
	closed, err := env.c.CreateSandbox(ctx, clientOpts())
	if err != nil {
		t.Fatal(err)
	}
	closed.Close(ctx)
	if _, err := closed.Exec(ctx, client.ExecOptions{Shell: "true"}); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("exec in a closed sandbox: got %v", err)
	}
	if err := closed.Close(ctx); !errdefs.IsNotFound(err) {
		t.Errorf("closing twice: got %v", err)
	}
	if err := env.c.RemoveImage(ctx, env.image); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("removing an image a live sandbox uses: got %v", err)
	}
	if _, err := env.c.ImportImage(ctx, "/no/such/archive.tar", "", nil); !errdefs.IsNotFound(err) {
		t.Errorf("import of a missing file: got %v", err)
	}
	junk := filepath.Join(t.TempDir(), "junk.tar")
	os.WriteFile(junk, []byte("not a tarball"), 0o644)
	if _, err := env.c.ImportImage(ctx, junk, "", nil); !errdefs.IsInvalidArgument(err) {
		t.Errorf("import of junk: got %v", err)
	}
	if _, err := env.c.PullImage(ctx, "UPPER/case::bad", false, nil); !errdefs.IsInvalidArgument(err) {
		t.Errorf("pull of a bad reference: got %v", err)
	}
}

func countSandboxes(t *testing.T) int {
	t.Helper()
	list, err := env.c.ListSandboxes(context.Background(), true)
	if err != nil {
		t.Fatal(err)
	}
	return len(list)
}

// TestCLI runs the forkbox binary as a user would.
func TestCLI(t *testing.T) {
	fb := func(args ...string) (string, string, int) {
		cmd := exec.Command(env.bin, append([]string{"--host", "unix://" + env.socket}, args...)...)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		code := 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		}
		return out.String(), errb.String(), code
	}
	out, errs, code := fb("create", "--image", env.image, "--name", "cli-sb", "--memory", "128Mi", "--json")
	if code != 0 {
		t.Fatalf("create: %d %s", code, errs)
	}
	var info struct {
		Id, Name, State string
	}
	if err := json.Unmarshal([]byte(out), &info); err != nil || info.Name != "cli-sb" || info.State != "running" {
		t.Fatalf("create --json: %q, %v", out, err)
	}
	defer fb("rm", "cli-sb")
	if out, _, code := fb("exec", "cli-sb", "--", "sh", "-c", "echo out; echo err >&2; exit 7"); code != 7 || out != "out\n" {
		t.Errorf("exec: exit %d out %q; want 7 and out", code, out)
	}
	if _, errs, code := fb("exec", "nope", "--", "true"); code != 1 || !strings.Contains(errs, "NotFound") {
		t.Errorf("exec in an unknown sandbox: exit %d, stderr %q; want 1 and the class", code, errs)
	}
	if out, _, code := fb("--json", "create", "--image", env.image, "--cpu", "lots"); code != 1 || !strings.Contains(out, `"InvalidArgument"`) {
		t.Errorf("bad cpu --json: exit %d, out %q", code, out)
	}
	if out, _, _ := fb("ls"); !strings.Contains(out, "cli-sb") {
		t.Errorf("ls: %q", out)
	}
	if out, _, _ := fb("logs", "cli-sb", "--json"); !strings.Contains(out, "exec.finished") {
		t.Errorf("logs: %q", out)
	}
	if out, _, _ := fb("inspect", "cli-sb"); !strings.Contains(out, `"runtime": "gvisor"`) {
		t.Errorf("inspect: %q", out)
	}
	if out, _, _ := fb("image", "ls", "--json"); !strings.Contains(out, env.image) {
		t.Errorf("image ls: %q", out)
	}
	if _, _, code := fb("rm", "cli-sb"); code != 0 {
		t.Errorf("rm: exit %d", code)
	}
}

// TestTCPNeedsToken restarts the daemon with a TCP listener.
func TestTCPNeedsToken(t *testing.T) {
	addr := freeAddr(t)
	withDaemonFlags(t, "--tcp", addr, "--api-token", "s3cret")
	ctx := context.Background()
	anon := &client.Client{URL: "http://" + addr}
	if _, err := anon.ListSandboxes(ctx, false); !errdefs.IsUnauthenticated(err) {
		t.Errorf("no token: got %v", err)
	}
	wrong := &client.Client{URL: "http://" + addr, Token: "nope"}
	if _, err := wrong.ListSandboxes(ctx, false); !errdefs.IsUnauthenticated(err) {
		t.Errorf("wrong token: got %v", err)
	}
	ok := &client.Client{URL: "http://" + addr, Token: "s3cret"}
	if _, err := ok.ListSandboxes(ctx, false); err != nil {
		t.Errorf("right token: %v", err)
	}
}
