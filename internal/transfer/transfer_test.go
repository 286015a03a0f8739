package transfer

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/forkbox/forkbox/errdefs"
)

const mb = 1 << 20

// TestFullAndIncremental: a full pull, then a chain across two nodes in
// both directions (fork of a fork of a fork) sent incrementally, with the
// bytes shipped; a child of a received checkpoint is writable and the
// received checkpoint is not.
func TestFullAndIncremental(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	trust := StaticTrust{}
	a, b := newNode(t, "a", trust), newNode(t, "b", trust)

	big := a.write(t, "sb-1", "", "big", 20*mb)
	a.checkpoint(t, "ck-1", "sb-1", false)
	res, err := b.client.Pull(ctx, a.peer(), Request{Checkpoint: "ck-1", UUID: a.uuid(t, "ck-1")})
	if err != nil {
		t.Fatalf("full pull: %v", err)
	}
	t.Logf("full: %+v", res)
	if res.Parent != "" || res.SendBytes < 20*mb || res.SendBytes > 21*mb {
		t.Errorf("full pull: got parent %q, %d bytes sent, want a full send of about 20 MiB", res.Parent, res.SendBytes)
	}
	b.requireHeld(t, "ck-1", "big", big)
	if got, want := b.uuid(t, "ck-1"), a.uuid(t, "ck-1"); got != want {
		t.Errorf("received UUID of ck-1 on b: got %s, want %s", got, want)
	}
	if ck, err := b.ledger.GetCheckpoint(ctx, "ck-1"); err != nil || ck.Kind != "filesystem" || ck.SandboxID != "sb-1" {
		t.Errorf("b's ledger record of ck-1: got %+v, %v", ck, err)
	}
	if _, err := b.client.Pull(ctx, a.peer(), Request{Checkpoint: "ck-1"}); !errdefs.IsAlreadyExists(err) {
		t.Errorf("second pull of ck-1: got %v, want AlreadyExists", err)
	}

	// A child on b writes 1 MiB and is checkpointed there; a pulls it
	// back from b, incrementally from its own (original) ck-1.
	small := b.write(t, "sb-2", "ck-1", "small", mb)
	b.checkpoint(t, "ck-2", "sb-2", false)
	res, err = a.client.Pull(ctx, b.peer(), Request{Checkpoint: "ck-2", UUID: b.uuid(t, "ck-2"), Have: []string{"ck-1"}})
	if err != nil {
		t.Fatalf("incremental pull b→a: %v", err)
	}
	t.Logf("incremental b→a: %+v", res)
	if res.Parent != "ck-1" || res.SendBytes > 2*mb {
		t.Errorf("incremental pull: got parent %q, %d bytes sent, want from ck-1 with about 1 MiB", res.Parent, res.SendBytes)
	}
	a.requireHeld(t, "ck-2", "small", small)
	a.requireHeld(t, "ck-2", "big", big)

	// And a third generation on a goes to b, from b's received ck-2.
	third := a.write(t, "sb-3", "ck-2", "third", 2*mb)
	a.checkpoint(t, "ck-3", "sb-3", false)
	res, err = b.client.Pull(ctx, a.peer(), Request{Checkpoint: "ck-3", UUID: a.uuid(t, "ck-3"), Have: []string{"ck-2", "ck-1"}})
	if err != nil {
		t.Fatalf("incremental pull a→b: %v", err)
	}
	t.Logf("incremental a→b: %+v", res)
	if res.Parent != "ck-2" || res.SendBytes > 3*mb {
		t.Errorf("incremental pull: got parent %q, %d bytes sent, want from ck-2 with about 2 MiB", res.Parent, res.SendBytes)
	}
	b.requireHeld(t, "ck-3", "third", third)
	b.requireHeld(t, "ck-3", "big", big)

	// Children of a received checkpoint are writable snapshots of it.
	if err := b.snaps.Prepare(ctx, "child", "ck-3"); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(b.root(), "active", "child", "upper", "big"), []byte("x"), 0o644); err != nil {
		t.Fatalf("write into a child of a received checkpoint: %v", err)
	}
	b.requireHeld(t, "ck-3", "big", big)
}

// TestMemoryImage: a memory checkpoint's image travels with it.
func TestMemoryImage(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	trust := StaticTrust{}
	a, b := newNode(t, "a", trust), newNode(t, "b", trust)
	a.write(t, "sb-1", "", "f", mb)
	a.checkpoint(t, "ck-m", "sb-1", true)
	res, err := b.client.Pull(ctx, a.peer(), Request{Checkpoint: "ck-m"})
	if err != nil {
		t.Fatal(err)
	}
	if res.FileBytes != 4*mb+2 {
		t.Errorf("file bytes: got %d, want %d", res.FileBytes, 4*mb+2)
	}
	for _, f := range []string{"mem/checkpoint.img", "mem/pages.img", "config.json"} {
		want, _ := os.ReadFile(filepath.Join(a.local.MemRoot, "ck-m", f))
		got, err := os.ReadFile(filepath.Join(b.local.MemRoot, "ck-m", f))
		if err != nil || string(got) != string(want) {
			t.Errorf("memory image file %s on b: got %d bytes (%v), want %d", f, len(got), err, len(want))
		}
	}
	if ents, _ := filepath.Glob(filepath.Join(b.local.MemRoot, stagingPrefix+"*")); len(ents) > 0 {
		t.Errorf("staging left: %v", ents)
	}
}

// TestRefusedPeers: a client whose certificate no node published, and a
// server that is not the node pinned, get nothing.
func TestRefusedPeers(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	trust := StaticTrust{}
	a, b := newNode(t, "a", trust), newNode(t, "b", trust)
	a.write(t, "sb-1", "", "f", mb)
	a.checkpoint(t, "ck-1", "sb-1", false)

	stranger, _, err := NewIdentity("b")
	if err != nil {
		t.Fatal(err)
	}
	c := &Client{Identity: stranger, Local: b.local}
	if _, err := c.Pull(ctx, a.peer(), Request{Checkpoint: "ck-1"}); !errdefs.IsUnavailable(err) {
		t.Errorf("pull with an unknown client certificate: got %v, want refused (Unavailable)", err)
	}
	b.requireNothing(t, "ck-1")

	impostor := a.peer()
	impostor.CertPEM = b.id.CertPEM // a pins b's certificate: a's own is refused
	if _, err := b.client.Pull(ctx, impostor, Request{Checkpoint: "ck-1"}); !errdefs.IsUnavailable(err) {
		t.Errorf("pull from a server whose certificate is not the pinned one: got %v, want refused", err)
	}
	b.requireNothing(t, "ck-1")
	if _, err := b.client.Pull(ctx, a.peer(), Request{Checkpoint: "ck-1", UUID: "00000000-0000-0000-0000-000000000001"}); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("pull naming another subvolume's UUID: got %v, want FailedPrecondition", err)
	}
	b.requireNothing(t, "ck-1")
	if _, err := b.client.Pull(ctx, a.peer(), Request{Checkpoint: "ck-none"}); !errdefs.IsNotFound(err) {
		t.Errorf("pull of an unknown checkpoint: got %v, want NotFound", err)
	}
}

// TestOversizedStream: a pull past the receiver's byte limit stops there
// and leaves nothing.
func TestOversizedStream(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	trust := StaticTrust{}
	a, b := newNode(t, "a", trust), newNode(t, "b", trust)
	a.write(t, "sb-1", "", "f", 8*mb)
	a.checkpoint(t, "ck-1", "sb-1", false)
	c := &Client{Identity: b.id, Local: b.local, Limits: Limits{MaxBytes: 2 * mb}}
	res, err := c.Pull(ctx, a.peer(), Request{Checkpoint: "ck-1"})
	if !errdefs.IsResourceExhausted(err) {
		t.Fatalf("oversized pull: got %v, want ResourceExhausted", err)
	}
	if res.WireBytes > 2*mb {
		t.Errorf("read %d bytes, limit %d", res.WireBytes, 2*mb)
	}
	b.requireNothing(t, "ck-1")
	// Within the limit it works.
	if _, err := b.client.Pull(ctx, a.peer(), Request{Checkpoint: "ck-1"}); err != nil {
		t.Fatalf("pull after the refused one: %v", err)
	}
}

func isRefused(err error) bool { return errors.Is(err, errdefs.ErrInvalidArgument) }
