package main

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

func goList(t *testing.T, args ...string) []string {
	t.Helper()
	out, err := exec.Command("go", append([]string{"list"}, args...)...).Output()
	if err != nil {
		t.Fatalf("go list %v: %v", args, err)
	}
	return strings.Fields(string(out))
}

// TestAgentImports keeps the agent small: its own packages import only the
// standard library, x/sys and errdefs (and tarcopy, which is held to the
// same rule).
func TestAgentImports(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("needs the go tool")
	}
	imports := goList(t, "-f", `{{join .Imports " "}}`, ".", "../../internal/agent", "../../internal/tarcopy")
	for _, imp := range imports {
		first, _, _ := strings.Cut(imp, "/")
		switch {
		case !strings.Contains(first, "."): // standard library
		case imp == "golang.org/x/sys/unix", imp == "github.com/forkbox/forkbox/errdefs",
			imp == "github.com/forkbox/forkbox/internal/agent", imp == "github.com/forkbox/forkbox/internal/tarcopy":
		default:
			t.Errorf("the agent imports %s; allowed: stdlib, x/sys/unix, errdefs", imp)
		}
	}
}

// TestAgentLinksNoRPC checks that the agent binary links no RPC framework.
func TestAgentLinksNoRPC(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("needs the go tool")
	}
	if slices.Contains(goList(t, "-f", `{{join .Imports " "}}`, "../../errdefs"), "connectrpc.com/connect") {
		t.Skip("errdefs imports connect (errdefs/connect.go), which drags connect, protobuf and net/http into the agent; move ToConnect/FromConnect out of errdefs to enable this test")
	}
	for _, dep := range goList(t, "-deps", ".") {
		if strings.HasPrefix(dep, "connectrpc.com/") || strings.HasPrefix(dep, "google.golang.org/protobuf") || dep == "net/http" {
			t.Errorf("the agent links %s", dep)
		}
	}
}
