// Tests of the rules in STYLE.md that a machine can check: the public
// surface (client, api, errdefs) imports nothing internal, and every package
// says what it owns in a doc comment.
package forkbox_test

import (
	"os/exec"
	"strings"
	"testing"
)

type pkg struct {
	path, doc string
	deps      []string
}

func listPackages(t *testing.T) []pkg {
	t.Helper()
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}}\t{{.Doc}}\t{{len .GoFiles}}\t{{join .Deps \" \"}}", "./...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	var pkgs []pkg
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.SplitN(line, "\t", 4)
		if len(f) != 4 || f[2] == "0" { // test-only packages have no doc to give
			continue
		}
		pkgs = append(pkgs, pkg{path: f[0], doc: f[1], deps: strings.Fields(f[3])})
	}
	return pkgs
}

const module = "github.com/forkbox/forkbox"

func TestPublicSurfaceImportsNothingInternal(t *testing.T) {
	for _, p := range listPackages(t) {
		rel := strings.TrimPrefix(p.path, module+"/")
		if !strings.HasPrefix(rel, "client") && !strings.HasPrefix(rel, "api") && !strings.HasPrefix(rel, "errdefs") {
			continue
		}
		for _, d := range p.deps {
			if strings.HasPrefix(d, module+"/internal/") {
				t.Errorf("public package %s imports %s", p.path, d)
			}
		}
	}
}

func TestEveryPackageHasADocComment(t *testing.T) {
	for _, p := range listPackages(t) {
		if p.doc == "" {
			t.Errorf("package %s has no doc comment", p.path)
		}
	}
}
