package cluster

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// objectName matches how a failed SDK test's error names the objects it
// made: generated object names (dash-joined parts, three or more, such as
// fork-python-base-8qrrr-2cjrf-0) and the nodes' local IDs.
var objectName = regexp.MustCompile(`(?:[a-z0-9]+(?:-[a-z0-9]+){2,}|(?:sb|ck)-[0-9a-f]{12})`)

// localID is how a node's log line names the local sandbox or checkpoint
// of an object.
var localID = regexp.MustCompile(`local=((?:sb|ck)-[0-9a-f]{12})`)

// logNoise are log lines that name objects and say nothing of them.
var logNoise = []string{"Waited before sending request"}

// namesIn are the object names in text (an error), once each.
func namesIn(text string) []string {
	var out []string
	for _, m := range objectName.FindAllString(text, -1) {
		if strings.ContainsAny(m, "abcdefghijklmnopqrstuvwxyz") && !slices.Contains(out, m) {
			out = append(out, m)
		}
	}
	return out
}

// linesNaming is what the processes logged of the objects a failure
// names: the lines of the logs at paths that contain one of names (but
// those of nodes, which every line of a node's log names), or one of the
// local IDs those lines give them, at most max of each log (its last).
func linesNaming(paths, nodes, names []string, max int) string {
	names = slices.DeleteFunc(slices.Clone(names), func(n string) bool { return slices.Contains(nodes, n) })
	if len(names) == 0 {
		return ""
	}
	logs := make([][]string, len(paths))
	for i, p := range paths {
		b, _ := os.ReadFile(p)
		logs[i] = strings.Split(string(b), "\n")
	}
	// The local IDs first: a node logs many steps by them alone.
	for _, lines := range logs {
		for _, l := range lines {
			if m := localID.FindStringSubmatch(l); m != nil && mentions(l, names) && !slices.Contains(names, m[1]) {
				names = append(names, m[1])
			}
		}
	}
	var b strings.Builder
	for i, lines := range logs {
		var got []string
		for _, l := range lines {
			if mentions(l, names) && !slices.ContainsFunc(logNoise, func(n string) bool { return strings.Contains(l, n) }) {
				got = append(got, l)
			}
		}
		if len(got) == 0 {
			continue
		}
		if len(got) > max {
			got = got[len(got)-max:]
		}
		b.WriteString("---- " + filepath.Base(paths[i]) + ", lines naming " + strings.Join(names, ", ") + " ----\n")
		b.WriteString(strings.Join(got, "\n") + "\n")
	}
	return b.String()
}

func mentions(line string, names []string) bool {
	return slices.ContainsFunc(names, func(n string) bool { return strings.Contains(line, n) })
}

// logNamed logs what the cluster's processes (controller, nodes,
// gateway) logged of the objects failure names. The cluster's directory,
// and so its logs, goes when the suite ends, and the logs' ends printed
// then are of later tests.
func logNamed(t *testing.T, failure string) {
	t.Helper()
	if cl == nil {
		return
	}
	paths, nodes := []string{cl.ControllerLogPath()}, []string(nil)
	for _, n := range cl.Nodes {
		paths, nodes = append(paths, n.LogPath()), append(nodes, n.Name)
	}
	paths = append(paths, filepath.Join(cl.Dir, "gateway.log"))
	if s := linesNaming(paths, nodes, namesIn(failure), 200); s != "" {
		t.Logf("what the cluster logged of the objects named in that failure:\n%s", s)
	}
}

// tapBlock is the YAML block of TAP test name's "not ok" line: its error.
func tapBlock(out, name string) string {
	lines := strings.Split(out, "\n")
	for i, l := range lines {
		tl := strings.TrimSpace(l)
		if !strings.HasPrefix(tl, "not ok ") || !strings.HasSuffix(tl, " - "+name) {
			continue
		}
		var b strings.Builder
		for _, y := range lines[i+1:] {
			if strings.TrimSpace(y) == "..." {
				break
			}
			b.WriteString(y + "\n")
		}
		return b.String()
	}
	return ""
}

// The names a failed SDK test's error gives are found, and timestamps,
// paths and plain words are not names.
func TestNamesIn(t *testing.T) {
	got := namesIn(`error: 'fork of fork-python-base-8qrrr-2cjrf: no child started: child fork-python-base-8qrrr-2cjrf-0 ` +
		`is not running by the deadline (it may still start; last seen phase "Pending" on node "node-f5e2-0": restoring sb-0123456789ab)' ` +
		`at 2026-12-05T11:44:55Z (file:///tmp/run/sdk/typescript/test/seed-examples.test.mjs:86:3) per-fork track-a`)
	want := []string{"fork-python-base-8qrrr-2cjrf", "fork-python-base-8qrrr-2cjrf-0", "node-f5e2-0", "sb-0123456789ab"}
	if !slices.Equal(got, want) {
		t.Errorf("namesIn: got %q, want %q", got, want)
	}
	out := "    not ok 2 - two tracks\n      ---\n      error: 'child box-ab12c-0 failed'\n      ...\n    not ok 3 - other\n"
	if b := tapBlock(out, "two tracks"); !strings.Contains(b, "box-ab12c-0") || strings.Contains(b, "not ok 3") {
		t.Errorf("tapBlock: got %q", b)
	}
}

// The lines of a failed test's objects are found in every log, with
// those of the local IDs the nodes gave them, and not the nodes' other
// lines nor the client's throttling.
func TestLinesNaming(t *testing.T) {
	dir := t.TempDir()
	ctrl, node := filepath.Join(dir, "controller.log"), filepath.Join(dir, "node-a-0.log")
	os.WriteFile(ctrl, []byte(`level=INFO msg=fork fork=ns/fk-x phase=Forking
level=DEBUG msg="Waited before sending request" Sandbox.name=fk-x-0
level=INFO msg="sandbox placed" sandbox=ns/fk-x-0 node=node-a-0
level=INFO msg="sandbox placed" sandbox=ns/other-y-0 node=node-a-0
`), 0o644)
	os.WriteFile(node, []byte(`level=INFO msg="restoring" component=node-agent node=node-a-0 sandbox=ns/fk-x-0 local=sb-0123456789ab
level=DEBUG msg="create phases" sandbox=sb-0123456789ab total_ms=9
level=DEBUG msg="create phases" sandbox=sb-ffffffffffff total_ms=9 node=node-a-0
`), 0o644)
	got := linesNaming([]string{ctrl, node, filepath.Join(dir, "absent.log")}, []string{"node-a-0"}, namesIn("child fk-x-0 on node node-a-0"), 10)
	for _, want := range []string{"sandbox=ns/fk-x-0 node=node-a-0", "local=sb-0123456789ab", `"create phases" sandbox=sb-0123456789ab`} {
		if !strings.Contains(got, want) {
			t.Errorf("missing %q in:\n%s", want, got)
		}
	}
	for _, not := range []string{"Waited", "other-y-0", "sb-ffffffffffff"} {
		if strings.Contains(got, not) {
			t.Errorf("%q should not be in:\n%s", not, got)
		}
	}
	if got := linesNaming([]string{ctrl, node}, []string{"node-a-0"}, []string{"node-a-0"}, 10); got != "" {
		t.Errorf("a node's name alone: got %q, want nothing", got)
	}
}
