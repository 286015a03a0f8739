package daemon

import "testing"

// The pool's book: bounded, one boot at a time, filled for the key asked
// for last, members of another key evicted oldest first, each member
// handed out once.
func TestPrebootPoolBook(t *testing.T) {
	a, b := prebootKey{runtime: RuntimeGVisor, memory: 1}, prebootKey{runtime: RuntimeGVisor, memory: 2}
	p := newPrebootPool(2, a)
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
	if _, _, ok := p.next(); ok {
		t.Fatal("a boot with the pool full of the wanted key")
	}
	if m := p.take(b); m != nil {
		t.Fatalf("take(b) = %s, want a miss", m.id)
	}
	key, evict, ok := p.next()
	if !ok || key != b || evict == nil || evict.id != "a1" {
		t.Fatalf("next after a miss for b: key %v evict %v ok %v; want a boot for b evicting a1", key, evict, ok)
	}
	p.booted(&prebooted{id: "b1", key: b})
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
