package daemon

import "testing"

// The pool's book: bounded, one boot at a time, filled for the key asked
// for last, members of another key evicted oldest first, each member
// handed out once.
func TestPrebootPoolBook(t *testing.T) {
	a, b := prebootKey{runtime: RuntimeGVisor, memory: 1}, prebootKey{runtime: RuntimeGVisor, memory: 2}
	p := newPrebootPool(2, a)
	pending := func(want int) {
		t.Helper()
		if got := p.pending(); got != want {
			t.Fatalf("pending %d, want %d", got, want)
		}
	}
	pending(2)
	boot := func(want prebootKey, id string) {
		t.Helper()
		key, evict, ok := p.next()
		if !ok || key != want || evict != nil {
			t.Fatalf("next: key %v evict %v ok %v; want a boot for %v", key, evict, ok, want)
		}
		if _, _, again := p.next(); again {
			t.Fatal("a second boot while one is under way")
		}
		p.booted(&prebooted{id: id, key: key})
	}
	boot(a, "a1")
	boot(a, "a2")
	pending(0)
	if _, _, ok := p.next(); ok {
		t.Fatal("a boot with the pool full of the wanted key")
	}
	if m := p.take(b); m != nil {
		t.Fatalf("take(b) = %s, want a miss", m.id)
	}
	pending(2) // two of b wanted; the a members do not count
	key, evict, ok := p.next()
	if !ok || key != b || evict == nil || evict.id != "a1" {
		t.Fatalf("next after a miss for b: key %v evict %v ok %v; want a boot for b evicting a1", key, evict, ok)
	}
	pending(2) // the one booting is still pending
	p.booted(&prebooted{id: "b1", key: b})
	pending(1)
	if m := p.take(b); m == nil || m.id != "b1" {
		t.Fatalf("take(b) = %v, want b1", m)
	}
	if m := p.take(b); m != nil {
		t.Fatalf("b1 handed out twice (got %s)", m.id)
	}
	if m := p.take(a); m == nil || m.id != "a2" {
		t.Fatalf("take(a) = %v, want a2", m)
	}
	p.booted(nil) // a failed boot is counted, and frees the boot slot
	st := p.stats
	if st.Hits != 2 || st.Misses != 2 || st.Booted != 3 || st.BootFailed != 1 || st.Discarded != 1 {
		t.Errorf("stats %+v: want 2 hits, 2 misses, 3 booted, 1 failed, 1 discarded", st)
	}
}

// The pool shared between the kinds: once memory-fork children asked for a
// created member, half the pool keeps that kind and half the booted one
// (the kind asked for last takes the odd one), so alternating creates and
// memory forks do not replace one kind with the other at every switch.
func TestPrebootPoolKinds(t *testing.T) {
	a := prebootKey{runtime: RuntimeGVisor, memory: 1}
	c := a
	c.created = true
	p := newPrebootPool(3, a)
	fill := func(ids ...string) {
		t.Helper()
		for _, id := range ids {
			key, evict, ok := p.next()
			if !ok {
				t.Fatalf("next: no boot, want one for %s", id)
			}
			if evict != nil {
				t.Logf("%s evicts %s", id, evict.id)
			}
			p.booted(&prebooted{id: id, key: key})
		}
		if _, _, ok := p.next(); ok {
			t.Fatalf("a boot past the shares (pool %v)", ids)
		}
	}
	book := func() (out string) {
		for _, m := range p.ready {
			out += m.id + " "
		}
		return out
	}
	fill("a1", "a2", "a3")
	if m := p.take(c); m != nil {
		t.Fatalf("take(created) = %s, want a miss", m.id)
	}
	// Created asked for last: 2 created, 1 booted; the oldest booted go.
	fill("c1", "c2")
	if got := book(); got != "a3 c1 c2 " {
		t.Errorf("after a created miss: pool %q, want a3 c1 c2", got)
	}
	if m := p.take(a); m == nil || m.id != "a3" {
		t.Fatalf("take(booted) = %v, want a3", m)
	}
	// Booted asked for last: 2 booted, 1 created; the extra created goes.
	fill("a4", "a5")
	if got := book(); got != "c2 a4 a5 " {
		t.Errorf("after a booted hit: pool %q, want c2 a4 a5", got)
	}
	if m := p.take(c); m == nil || m.id != "c2" {
		t.Fatalf("take(created) = %v, want c2", m)
	}
	for _, m := range p.ready {
		if m.key.created {
			t.Errorf("%s: a created member left after the last was taken", m.id)
		}
	}
}
