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

	"sigs.k8s.io/controller-runtime/pkg/client"

	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
)

// sdkRun runs an SDK's own test command against the gateway (through the
// env its helpers read) and returns its output.
func sdkRun(t *testing.T, dir string, name string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	// COLUMNS: pytest's summary lines keep whole test names.
	cmd.Env = append(os.Environ(), "COLUMNS=1000", "FORKBOX_TEST_GATEWAY=http://"+gw.addr, "FORKBOX_TEST_TOKEN="+gw.token, "FORKBOX_TEST_IMAGE="+sdkImageName,
		"FORKBOX_TEST_ARCHIVE="+sdkArchive())
	out, err := cmd.CombinedOutput()
	t.Logf("%s %v: %v", name, args, err)
	return string(out)
}

// The TypeScript SDK's own suite against the gateway (it needs the SDK
// built: `npm ci && npm run build` in sdk/typescript, which `make test`
// does first). Every test passes but those listed in tsUnfit, which need
// what cluster mode does not have; one of those that passes is fine, any
// other failure fails this test.
func TestGatewayTypeScriptSDK(t *testing.T) {
	dir := filepath.Join("..", "..", "sdk", "typescript")
	needSDK(t, filepath.Join(dir, "dist", "index.js"), "the TypeScript SDK is not built (cd sdk/typescript && npm ci && npm run build)")
	gateway(t)
	freshTenant(t)
	sdkImage(t)
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
			logNamed(t, tapBlock(out, name))
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
var tsUnfit = map[string]string{}

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

// The Python SDK's own suite against the gateway: every test passes but
// those in pyUnfit.
func TestGatewayPythonSDK(t *testing.T) {
	needSDK(t, "/usr/bin/python3", "no /usr/bin/python3 (scripts/setup.sh installs it with python3-pytest)")
	// The suite counts on its server's bound of pyMaxSandboxes live
	// sandboxes (conftest's MAX_SANDBOXES, its daemon's --max-sandboxes):
	// a fork's children past it fail one by one (ResourceExhausted) while
	// the others start. The cluster gets that many slots in all.
	keepRunning(t)
	setTotalSlots(t, pyMaxSandboxes)
	gateway(t)
	freshTenant(t)
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
			logNamed(t, l)
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

// pyMaxSandboxes is sdk/python/tests/conftest.py's MAX_SANDBOXES.
const pyMaxSandboxes = 10

// setTotalSlots restarts the nodes whose slots change so that the
// cluster has total slots in all, spread evenly (keepRunning puts the
// suite's back).
func setTotalSlots(t *testing.T, total int) {
	t.Helper()
	ns := nodes()
	for i, n := range ns {
		want := total / len(ns)
		if i < total%len(ns) {
			want++
		}
		if n.Slots == want {
			continue
		}
		n.Slots = want
		if err := n.Restart(context.Background()); err != nil {
			t.Fatalf("restart %s with %d slots: %v", n.Name, want, err)
		}
		t.Logf("node %s: %d slots", n.Name, want)
	}
}

// pyUnfit are the Python SDK's tests that need what cluster mode has not
// (yet), with why.
var pyUnfit = map[string]string{}

// needSDK skips (outside CI) or fails (in CI) a test whose SDK prerequisite
// path is missing.
func needSDK(t *testing.T, path, why string) {
	t.Helper()
	if _, err := os.Stat(path); err == nil {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("prerequisite missing in CI: %s", why)
	}
	t.Skip(why)
}

// freshTenant gives an SDK suite the gateway's namespace as its own fresh
// daemon is to it, and takes back what the suite left when it ends (a
// suite's daemon goes with it): no environment, no sandbox, live or
// closed, of an earlier suite or test (both SDKs' seed examples build an
// environment python-base, and the Python one counts its closed
// builders; a failed test can leave sandboxes that hold slots).
func freshTenant(t *testing.T) {
	t.Helper()
	clean := func() {
		ctx := context.Background()
		var el fbv1.EnvironmentList
		if err := plane.Client.List(ctx, &el, client.InNamespace(gw.namespace)); err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, e := range el.Items {
			names = append(names, e.Name)
		}
		cleanEnvironments(t, names...)
		var sl fbv1.SandboxList
		if err := plane.Client.List(ctx, &sl, client.InNamespace(gw.namespace)); err != nil {
			t.Fatal(err)
		}
		for i := range sl.Items {
			sb := &sl.Items[i]
			if err := plane.Client.Delete(ctx, sb); client.IgnoreNotFound(err) != nil {
				t.Fatalf("delete sandbox %s: %v", sb.Name, err)
			}
			gone(t, sb)
		}
	}
	clean()
	t.Cleanup(clean)
}
