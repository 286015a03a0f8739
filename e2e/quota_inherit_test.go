package e2e

import (
	"context"
	"testing"

	"github.com/forkbox/forkbox/client"
)

// TestDiskQuotaRestoreResume: restores and resumes keep the session's disk
// limit, as forks do; while one sandbox sits at its limit, another writes,
// forks and checkpoints, and the daemon's ledger and metrics keep working.
func TestDiskQuotaRestoreResume(t *testing.T) {
	forEachRuntime(t, func(t *testing.T) {
		ctx := context.Background()
		o := clientOpts()
		o.Name = "quota-session-" + curRuntime
		o.Resources.Disk = "48Mi"
		sb := newSandbox(t, o)
		ck, err := sb.Checkpoint(ctx, "empty")
		if err != nil {
			t.Fatal(err)
		}
		if n, full := fill(t, sb, "/fill", 200); !full || n > 56 {
			t.Fatalf("fill: got %d MiB, full=%v", n, full)
		}

		// Meanwhile, with one sandbox full: another works, forks and
		// checkpoints; the full one's ledger and metrics answer.
		other := newSandbox(t, clientOpts())
		if _, full := fill(t, other, "/data", 64); full {
			t.Errorf("another sandbox is refused 64 MiB while one is full")
		}
		res, err := other.Fork(ctx, client.ForkOptions{Count: 1})
		if err != nil || res.Children[0].Err != nil {
			t.Fatalf("fork beside a full sandbox: %v %+v", err, res)
		}
		res.Children[0].Sandbox.Close(ctx)
		if _, err := sb.Events(ctx); err != nil {
			t.Errorf("ledger of the full sandbox: %v", err)
		}
		m, err := sb.Metrics(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("full sandbox: disk %d of %d bytes", m.DiskBytes, m.DiskLimitBytes)
		if m.DiskLimitBytes != 48<<20 {
			t.Errorf("metrics disk limit: got %d, want 48 MiB", m.DiskLimitBytes)
		}

		restored, err := env.c.RestoreSnapshot(ctx, ck.Id, client.Overrides{}, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer restored.Close(ctx)
		if got := restored.Info.GetResources().GetDisk(); got != "48Mi" {
			t.Errorf("restored: disk %q, want 48Mi", got)
		}
		if n, full := fill(t, restored, "/fill", 200); !full || n > 56 {
			t.Errorf("restored past its limit: got %d MiB, full=%v", n, full)
		}

		mustSh(t, sb, "rm /fill")
		sb.Close(ctx)
		rs, err := env.c.Resume(ctx, o.Name)
		if err != nil {
			t.Fatal(err)
		}
		defer rs.Sandbox.Close(ctx)
		if got := rs.Sandbox.Info.GetResources().GetDisk(); got != "48Mi" {
			t.Errorf("resumed: disk %q, want 48Mi", got)
		}
		if n, full := fill(t, rs.Sandbox, "/again", 200); !full || n > 56 {
			t.Errorf("resumed past its limit: got %d MiB, full=%v", n, full)
		}
	})
}
