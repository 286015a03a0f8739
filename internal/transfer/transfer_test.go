package transfer

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
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
	a.grant(b, "ck-1")
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
	b.grant(a, "ck-2", "ck-1") // its ancestors too, as placement grants them
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
	a.grant(b, "ck-3", "ck-2")
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
	a.grant(b, "ck-m")
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
	a.grant(b, "ck-1", "ck-none")

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

// TestPullNeedsGrant: a trusted node gets only the checkpoints the
// server's Grants give it; others are refused, PermissionDenied, with a
// message naming the node and the checkpoint, before anything is sent;
// a node granted nothing gets nothing; the granted pull works.
func TestPullNeedsGrant(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	trust := StaticTrust{}
	a, b, c := newNode(t, "a", trust), newNode(t, "b", trust), newNode(t, "c", trust)
	a.write(t, "sb-1", "", "f", mb)
	a.checkpoint(t, "ck-1", "sb-1", false)
	a.checkpoint(t, "ck-2", "sb-1", false)
	a.grant(b, "ck-1")
	for _, p := range []struct {
		who *node
		ck  string
	}{{b, "ck-2"}, {c, "ck-1"}, {c, "ck-2"}} {
		res, err := p.who.client.Pull(ctx, a.peer(), Request{Checkpoint: p.ck})
		if !errdefs.IsPermissionDenied(err) || !strings.Contains(err.Error(), "node "+p.who.name+" may not pull checkpoint "+p.ck) {
			t.Errorf("node %s pulls %s, not granted: got %v, want PermissionDenied naming the node and the checkpoint", p.who.name, p.ck, err)
		}
		if res.SendBytes != 0 {
			t.Errorf("node %s pulls %s, not granted: %d bytes of the send stream came", p.who.name, p.ck, res.SendBytes)
		}
		p.who.requireNothing(t, p.ck)
	}
	if _, err := b.client.Pull(ctx, a.peer(), Request{Checkpoint: "ck-1"}); err != nil {
		t.Fatalf("the granted pull: %v", err)
	}
}

// grantsFunc is Grants from a function.
type grantsFunc func(ctx context.Context, node, checkpoint string) error

func (f grantsFunc) MayPull(ctx context.Context, node, checkpoint string) error {
	return f(ctx, node, checkpoint)
}

// TestGrantErrors: a Grants lookup that fails for another reason than
// unavailability refuses too (PermissionDenied); unavailability stays
// Unavailable (the puller retries); a bad ID is refused before Grants are
// asked.
func TestGrantErrors(t *testing.T) {
	ctx := context.Background()
	asked := 0
	for _, c := range []struct {
		err  error
		want error
	}{
		{nil, nil},
		{errors.New("the record is corrupt"), errdefs.ErrPermissionDenied},
		{fmt.Errorf("list sandboxes: %w", errdefs.ErrUnavailable), errdefs.ErrUnavailable},
		{Denied("b", "ck-1", "no reason"), errdefs.ErrPermissionDenied},
	} {
		s := &Server{o: ServerOptions{Grants: grantsFunc(func(context.Context, string, string) error { asked++; return c.err })}}
		err := s.grant(ctx, "b", "ck-1")
		if (c.want == nil) != (err == nil) || (c.want != nil && !errors.Is(err, c.want)) {
			t.Errorf("grants answer %v: got %v, want class %v", c.err, err, c.want)
		}
		if err != nil && (!strings.Contains(err.Error(), "node b") || !strings.Contains(err.Error(), "checkpoint ck-1")) {
			t.Errorf("grants answer %v: got %q, want a message naming node b and ck-1", c.err, err)
		}
	}
	s := &Server{o: ServerOptions{Grants: grantsFunc(func(context.Context, string, string) error { asked++; return nil })}}
	before := asked
	if err := s.grant(ctx, "b", "../ck-1"); !errdefs.IsInvalidArgument(err) || asked != before {
		t.Errorf("a bad checkpoint ID: got %v (grants asked: %v), want InvalidArgument before asking", err, asked != before)
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
	a.grant(b, "ck-1")
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

// TestIncrementalOnlyFromGrantedBase: a peer that names in Have a
// checkpoint of the sender it may not pull, or one that is no ancestor
// of the checkpoint pulled, gets no send from it (a diff from it would
// show what it holds): the send is full.
func TestIncrementalOnlyFromGrantedBase(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	trust := StaticTrust{}
	a, b := newNode(t, "a", trust), newNode(t, "b", trust)
	a.write(t, "sb-secret", "", "secret", mb)
	a.checkpoint(t, "ck-secret", "sb-secret", false)
	a.write(t, "sb-1", "ck-secret", "mine", mb)
	a.checkpoint(t, "ck-1", "sb-1", false)
	a.grant(b, "ck-1")
	res, err := b.client.Pull(ctx, a.peer(), Request{Checkpoint: "ck-1", UUID: a.uuid(t, "ck-1"), Have: []string{"ck-secret"}})
	if err != nil || res.Parent != "" {
		t.Fatalf("pull naming an ungranted base: got parent %q, %v; want a full send", res.Parent, err)
	}
	// ck-other is granted and held by both, but no ancestor of ck-2.
	a.write(t, "sb-other", "", "other", mb)
	a.checkpoint(t, "ck-other", "sb-other", false)
	a.write(t, "sb-2", "ck-1", "two", mb)
	a.checkpoint(t, "ck-2", "sb-2", false)
	a.grant(b, "ck-other", "ck-2")
	if _, err := b.client.Pull(ctx, a.peer(), Request{Checkpoint: "ck-other"}); err != nil {
		t.Fatal(err)
	}
	res, err = b.client.Pull(ctx, a.peer(), Request{Checkpoint: "ck-2", UUID: a.uuid(t, "ck-2"), Have: []string{"ck-other"}})
	if err != nil || res.Parent != "" {
		t.Fatalf("pull naming a base that is no ancestor: got parent %q, %v; want a full send", res.Parent, err)
	}
}
