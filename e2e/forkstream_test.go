package e2e

import (
	"context"
	"strings"
	"testing"

	"github.com/forkbox/forkbox/client"
)

// TestForkStream: the streamed fork yields the capture, then every child
// once, each usable as it arrives; the CLI prints them as they come.
func TestForkStream(t *testing.T) {
	forEachRuntime(t, func(t *testing.T) {
		ctx := context.Background()
		src := newSandbox(t, clientOpts())
		mustSh(t, src, "echo streamed > /root/f")
		fs, err := src.ForkStream(ctx, client.ForkOptions{Count: 3, Tag: "stream"})
		if err != nil {
			t.Fatal(err)
		}
		defer fs.Close()
		if fs.Checkpoint == nil || fs.Count != 3 || fs.Captured != "filesystem" {
			t.Fatalf("capture: %+v, want a filesystem checkpoint for 3 children", fs)
		}
		seen := map[int]bool{}
		for i, c := range fs.Children() {
			if c.Err != nil {
				t.Fatalf("child %d: %v", i, c.Err)
			}
			t.Cleanup(func() { c.Sandbox.Close(context.Background()) })
			if seen[i] {
				t.Errorf("child %d twice", i)
			}
			seen[i] = true
			// Usable as it arrives, while its siblings may still start.
			if got := mustSh(t, c.Sandbox, "cat /root/f"); got != "streamed\n" {
				t.Errorf("child %d: %q", i, got)
			}
		}
		if err := fs.Err(); err != nil || len(seen) != 3 || fs.TotalMS <= 0 {
			t.Errorf("after the children: err %v, %d children, total %.0f ms; want nil, 3, > 0", err, len(seen), fs.TotalMS)
		}

		out, errs, code := cli(t, "fork", src.ID, "-n", "2")
		if code != 0 {
			t.Fatalf("forkbox fork -n 2: exit %d: %s%s", code, out, errs)
		}
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if len(lines) != 4 || !strings.HasPrefix(lines[0], "checkpoint ") || !strings.HasPrefix(lines[3], "2 started, 0 failed") {
			t.Fatalf("forkbox fork -n 2 printed:\n%s", out)
		}
		for _, l := range lines[1:3] {
			f := strings.Fields(l)
			if len(f) < 3 || !strings.HasPrefix(f[1], "sb-") {
				t.Fatalf("child line %q", l)
			}
			if sb, err := env.c.Sandbox(ctx, f[1]); err == nil {
				sb.Close(ctx)
			}
		}
	})
}
