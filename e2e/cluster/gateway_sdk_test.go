package cluster

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// sdkRun runs an SDK's own test command against the gateway (through the
// env its helpers read) and returns its output.
func sdkRun(t *testing.T, dir string, name string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "FORKBOX_TEST_GATEWAY=http://"+gw.addr, "FORKBOX_TEST_TOKEN="+gw.token, "FORKBOX_TEST_IMAGE="+sdkImageName,
		"FORKBOX_TEST_ARCHIVE="+sdkArchive())
	out, err := cmd.CombinedOutput()
	t.Logf("%s %v: %v", name, args, err)
	return string(out)
}

// The TypeScript SDK's own suite against the gateway. Opt-in
// (FORKBOX_GATEWAY_SDKS=1, after `npm ci && npm run build` in
// sdk/typescript): it adds a minute. Every test passes but those listed
// in tsUnfit, which need what cluster mode does not have; one of those
// that passes is fine, any other failure fails this test.
func TestGatewayTypeScriptSDK(t *testing.T) {
	if os.Getenv("FORKBOX_GATEWAY_SDKS") != "1" {
		t.Skip("set FORKBOX_GATEWAY_SDKS=1 to run the SDKs' suites against the gateway")
	}
	gateway(t)
	sdkImage(t)
	dir := filepath.Join("..", "..", "sdk", "typescript")
	files, _ := filepath.Glob(filepath.Join(dir, "test", "*.test.mjs"))
	args := []string{"--test", "--test-concurrency=1", "--test-reporter=tap"}
	for _, f := range files {
		args = append(args, filepath.Join("test", filepath.Base(f)))
	}
	out := sdkRun(t, dir, "node", args...)
	pass, fail, failed := tapCounts(out)
	t.Logf("TypeScript SDK against the gateway: %d passed, %d failed", pass, fail)
	if pass == 0 {
		t.Fatalf("no test passed:\n%s", out)
	}
	for _, name := range failed {
		why, ok := tsUnfit[name]
		if !ok {
			t.Errorf("failed, and it fits cluster mode: %q", name)
			continue
		}
		t.Logf("failed (unfit: %s): %s", why, name)
	}
	if t.Failed() {
		t.Logf("output:\n%s", out)
	}
}

// tsUnfit are the TypeScript SDK's tests that need what cluster mode has
// not (yet), with why.
var tsUnfit = map[string]string{
	"runs an async setup function once for concurrent callers":       "a second client on the daemon's local socket (new Client({ socket })): the gateway has none",
	"hands over from the warm pool":                                  "warm pools: the Environment object has none (refused: InvalidArgument naming cluster mode)",
	"every SDK result is a plain, JSON-serializable object":          "Resume at its end (c.resume): a session's ledger lives on one node; its importImage (the archive's bytes) and the rest pass",
	"checkpoints, restores (clean history) and resumes (replayed)":   "Resume: a session's ledger lives on one node",
	"reads a sandbox's counters":                                     "a closed sandbox's object is gone: NotFound, not FailedPrecondition",
	"basic usage: fork after install, run two workloads in parallel": "the ledger of a closed sandbox: its object is gone",
	"gives each sandbox port a URL with its token":                   "preview URLs: the harness's nodes serve no preview listener, and a node's takes the nodes' token, not the gateway's",
}

// tapCounts reads node's TAP: the totals and the names of the tests
// (leaves, not suites) that failed.
func tapCounts(out string) (pass, fail int, failed []string) {
	lines := strings.Split(out, "\n")
	for i, l := range lines {
		tl := strings.TrimSpace(l)
		switch {
		case strings.HasPrefix(tl, "# pass "):
			fmt.Sscan(strings.TrimPrefix(tl, "# pass "), &pass)
		case strings.HasPrefix(tl, "# fail "):
			fmt.Sscan(strings.TrimPrefix(tl, "# fail "), &fail)
		case strings.HasPrefix(tl, "not ok "):
			if suiteFailure(lines[i+1:]) {
				continue
			}
			if _, name, ok := strings.Cut(tl, " - "); ok {
				failed = append(failed, name)
			}
		}
	}
	return pass, fail, failed
}

// suiteFailure reports whether the YAML block after a "not ok" line says
// its subtests failed (a suite, not a test).
func suiteFailure(block []string) bool {
	for _, l := range block {
		switch tl := strings.TrimSpace(l); {
		case tl == "...":
			return false
		case tl == "failureType: 'subtestsFailed'":
			return true
		}
	}
	return false
}

// sdkImageName is the image the SDKs' suites expect (the name
// tools/mkimage gives it), imported on every node through the gateway.
const sdkImageName = "forkbox.local/busybox:latest"

// sdkArchive is the absolute path of the image archive the suites import.
func sdkArchive() string {
	p, _ := filepath.Abs(filepath.Join(cl.Dir, "busybox.tar"))
	return p
}

func sdkImage(t *testing.T) {
	t.Helper()
	b, err := os.ReadFile(sdkArchive())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := gw.c.ImportImageArchive(context.Background(), b, sdkImageName, nil); err != nil {
		t.Fatalf("import %s through the gateway: %v", sdkImageName, err)
	}
}

// The Python SDK's own suite against the gateway (opt-in like the
// TypeScript one): every test passes but those in pyUnfit.
func TestGatewayPythonSDK(t *testing.T) {
	if os.Getenv("FORKBOX_GATEWAY_SDKS") != "1" {
		t.Skip("set FORKBOX_GATEWAY_SDKS=1 to run the SDKs' suites against the gateway")
	}
	gateway(t)
	sdkImage(t)
	out := sdkRun(t, filepath.Join("..", "..", "sdk", "python"), "/usr/bin/python3", "-m", "pytest", "-q", "-rf", "--tb=line", "-p", "no:cacheprovider")
	var summary string
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, " passed") || strings.Contains(l, " failed") {
			summary = l
		}
		name, ok := strings.CutPrefix(l, "FAILED ")
		if !ok {
			continue
		}
		name, _, _ = strings.Cut(name, " - ")
		if why, ok := pyUnfit[name]; ok {
			t.Logf("failed (unfit: %s): %s", why, name)
		} else {
			t.Errorf("failed, and it fits cluster mode: %s (%s)", name, l)
		}
	}
	t.Logf("Python SDK against the gateway: %s", summary)
	if !strings.Contains(summary, " passed") {
		t.Fatalf("no test passed:\n%s", out)
	}
	if t.Failed() {
		t.Logf("output:\n%s", out)
	}
}

// pyUnfit are the Python SDK's tests that need what cluster mode has not
// (yet), with why.
var pyUnfit = map[string]string{
	"tests/test_environment.py::test_warm_pool_handover":                          "warm pools: the Environment object has none (refused: InvalidArgument naming cluster mode)",
	"tests/test_seed_examples.py::test_branching_experiments":                     "counts the daemon's closed builders (build-<env>-...) in list(all=True); a cluster's builder is an object <env>-<hash>, deleted once built",
	"tests/test_sandbox.py::test_checkpoint_restore_and_resume":                   "Resume: a session's ledger lives on one node",
	"tests/test_sandbox.py::test_create_exec_close":                               "list(all=True) and the ledger of a closed sandbox: its object is gone",
	"tests/test_seed_examples.py::test_basic_usage":                               "the ledger of a closed sandbox: its object is gone",
	"tests/test_sandbox.py::test_fork_one_child_failing_does_not_fail_the_others": "counts on the test daemon's --max-sandboxes 10",
	"tests/test_sandbox.py::test_port_url":                                        "the node's preview listener takes the nodes' token, not the gateway's",
}
