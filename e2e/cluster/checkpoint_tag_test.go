package cluster

import (
	"context"
	"testing"
	"time"

	fbclient "github.com/forkbox/forkbox/client"
	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
)

// Two checkpoints of one sandbox with one tag are two captures, as on
// one daemon: the second holds what was written between them (its node
// once took the first capture, found by tag, for the second).
func TestCheckpointSameTagTwice(t *testing.T) {
	c := gateway(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	sb, err := c.CreateSandbox(ctx, fbclient.CreateOptions{Image: env.image, Name: "same-tag", Runtime: string(fbv1.RuntimeCrun)})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close(context.Background())
	gsh(t, sb, "echo one > /root/a")
	first, err := sb.Checkpoint(ctx, "t")
	if err != nil {
		t.Fatal(err)
	}
	gsh(t, sb, "echo two > /root/a")
	second, err := sb.Checkpoint(ctx, "t")
	if err != nil {
		t.Fatal(err)
	}
	if first.Id == second.Id || first.Tag != "t" || second.Tag != "t" {
		t.Fatalf("checkpoints %s (%q) and %s (%q): want two of tag t", first.Id, first.Tag, second.Id, second.Tag)
	}
	for ck, want := range map[string]string{first.Id: "one\n", second.Id: "two\n"} {
		r, err := c.RestoreSnapshot(ctx, ck, fbclient.Overrides{}, nil)
		if err != nil {
			t.Fatal(err)
		}
		got := gsh(t, r, "cat /root/a")
		r.Close(ctx)
		if got != want {
			t.Errorf("restore of %s: %q, want %q", ck, got, want)
		}
	}
}
