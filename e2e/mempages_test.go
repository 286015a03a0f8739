package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/forkbox/forkbox/client"
)

// TestMemoryForkKeepsEveryPage: a process whose memory holds data pages,
// zero pages and pages it never touched, side by side (the probe's
// "pattern"), finds every page as it left it in each child of a memory
// fork, and again in the children of a second fork, whose save finds the
// pages the first one decommitted. gVisor's save skips what it need not
// read (forkbox's save-holes patch: holes of its memory file); a page it
// wrongly took for a hole would read as zeros here.
func TestMemoryForkKeepsEveryPage(t *testing.T) {
	ctx := context.Background()
	src := newSandbox(t, clientOpts())
	installProbe(t, src)
	if _, err := src.Start(ctx, client.ExecOptions{Shell: "exec /root/probe pattern 48 /root/pattern.out"}); err != nil {
		t.Fatal(err)
	}
	waitLine(t, src, "/root/pattern.out", "ready")
	// The probe's checks are counted in its memory: check n of a child is
	// the next after the source's last one.
	verify := func(sb *client.Sandbox, who string, n int) {
		t.Helper()
		mustSh(t, sb, "kill -USR1 $(pidof probe)")
		want := fmt.Sprintf("check %d ", n)
		if got := waitLine(t, sb, "/root/pattern.out", want); got != want+"ok" {
			t.Errorf("%s: %q, want %q", who, got, want+"ok")
		}
	}
	fork := func(sb *client.Sandbox, tag string, n int) []*client.Sandbox {
		t.Helper()
		res, err := sb.Fork(ctx, client.ForkOptions{Tag: tag, Count: n, Memory: true})
		if err != nil {
			t.Fatal(err)
		}
		kids := res.Sandboxes()
		closeAll(t, kids)
		if len(kids) != n || res.Captured != "filesystem+memory" {
			t.Fatalf("%s: memory fork: captured %q, children %+v", tag, res.Captured, res.Children)
		}
		return kids
	}
	verify(src, "the source", 1)
	var first []*client.Sandbox
	for round := 1; round <= 2; round++ {
		kids := fork(src, fmt.Sprintf("pages-%d", round), 2)
		for i, k := range kids {
			verify(k, fmt.Sprintf("round %d, child %d", round, i), round+1)
		}
		verify(src, fmt.Sprintf("the source after round %d", round), round+1)
		if round == 1 {
			first = kids
		}
	}
	// A child of a restored child: its save comes after a restore whose
	// pages were loaded in the background.
	grand := fork(first[0], "pages-grandchild", 1)
	verify(grand[0], "a grandchild", 3)
}

// waitLine polls the one-line file path in sb until it starts with prefix
// and returns the line.
func waitLine(t *testing.T, sb *client.Sandbox, path, prefix string) string {
	t.Helper()
	return waitFile(t, sb, path, fmt.Sprintf("%s starting with %q", path, prefix), func(s string) bool { return strings.HasPrefix(s, prefix) })
}
