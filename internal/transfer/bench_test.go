package transfer

import (
	"context"
	"fmt"
	"testing"
)

// BenchmarkFork: what a fork's child waits for before its rootfs exists,
// at the storage level, between two nodes on loop btrfs filesystems over
// loopback mutual TLS (no sandbox is started: the daemon's part after
// this is the same in all four). same-node: a writable snapshot of the
// checkpoint; cross-node-full: pull the checkpoint (100 MiB written),
// then the snapshot; replica-reused: the snapshot of the copy pulled
// before; incremental: pull a child's checkpoint (1 MiB more) from the
// ancestor both hold, then the snapshot. sent-B/op is the send stream.
//
//	sudo go test -run XXX -bench Fork -benchtime 5x ./internal/transfer/
func BenchmarkFork(b *testing.B) {
	requireRoot(b)
	ctx := context.Background()
	trust := StaticTrust{}
	tb := testing.TB(b)
	a, r := newNode(tb, "a", trust), newNode(tb, "b", trust)
	a.write(tb, "sb-src", "", "blob", 100<<20)
	a.checkpoint(tb, "ck-base", "sb-src", false)
	a.grant(r, "ck-base")
	n := 0
	child := func(nd *node, parent string) {
		n++
		key := fmt.Sprintf("child-%d", n)
		if err := nd.snaps.Prepare(ctx, key, parent); err != nil {
			b.Fatal(err)
		}
	}
	drop := func(nd *node, id string) {
		if err := nd.snaps.Remove(ctx, id); err != nil {
			b.Fatal(err)
		}
		if err := nd.ledger.DeleteCheckpoint(ctx, id); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("same-node", func(b *testing.B) {
		for range b.N {
			child(a, "ck-base")
		}
	})
	b.Run("cross-node-full", func(b *testing.B) {
		var sent int64
		for range b.N {
			if r.local.Holds(ctx, "ck-base") {
				b.StopTimer()
				drop(r, "ck-base")
				b.StartTimer()
			}
			res, err := r.client.Pull(ctx, a.peer(), Request{Checkpoint: "ck-base"})
			if err != nil {
				b.Fatal(err)
			}
			sent = res.SendBytes
			child(r, "ck-base")
		}
		b.ReportMetric(float64(sent), "sent-B/op")
	})
	b.Run("replica-reused", func(b *testing.B) {
		for range b.N {
			child(r, "ck-base")
		}
	})
	b.Run("incremental", func(b *testing.B) {
		var sent int64
		for range b.N {
			b.StopTimer()
			n++
			id := fmt.Sprintf("ck-inc-%d", n)
			a.write(tb, "sb-inc-"+id, "ck-base", "more", 1<<20)
			a.checkpoint(tb, id, "sb-inc-"+id, false)
			a.grant(r, id)
			b.StartTimer()
			res, err := r.client.Pull(ctx, a.peer(), Request{Checkpoint: id, Have: []string{"ck-base"}})
			if err != nil {
				b.Fatal(err)
			}
			if res.Parent != "ck-base" {
				b.Fatalf("pull of %s: parent %q, want ck-base", id, res.Parent)
			}
			sent = res.SendBytes
			child(r, id)
		}
		b.ReportMetric(float64(sent), "sent-B/op")
	})
}
