package daemon

import (
	"slices"
	"testing"
	"time"
)

// The schedule gives back what is due in deadline order, follows moved
// and cleared deadlines, and reports the nearest one left.
func TestSchedule(t *testing.T) {
	s := newSchedule()
	t0 := time.Unix(1_000_000, 0)
	at := func(sec int) time.Time { return t0.Add(time.Duration(sec) * time.Second) }
	s.set("a", at(30))
	s.set("b", at(10))
	s.set("c", at(20))
	s.set("d", time.Time{}) // tracked, no deadline
	s.set("e", at(5))
	s.set("e", at(40)) // moved later
	s.set("c", at(1))  // moved earlier
	s.set("b", time.Time{})
	s.remove("a")
	if tracked, dl := s.len(); tracked != 4 || dl != 2 {
		t.Fatalf("tracked %d with a deadline %d, want 4 and 2", tracked, dl)
	}
	ids, next := s.due(at(0))
	if len(ids) != 0 || !next.Equal(at(1)) {
		t.Fatalf("due at 0: %v, next %v; want none, next %v", ids, next, at(1))
	}
	ids, next = s.due(at(39))
	if !slices.Equal(ids, []string{"c"}) || !next.Equal(at(40)) {
		t.Fatalf("due at 39: %v, next %v; want [c], next %v", ids, next, at(40))
	}
	// c is being expired: the idle scan skips it, and marking it again fails.
	if got := s.idleCandidates(); slices.Contains(got, "c") || len(got) != 3 {
		t.Errorf("idle candidates %v, want b d e", got)
	}
	if s.markExpiring("c") {
		t.Error("markExpiring twice: got true")
	}
	s.expired("c")
	if !s.markExpiring("c") {
		t.Error("markExpiring after expired: got false")
	}
	ids, next = s.due(at(100))
	if !slices.Equal(ids, []string{"e"}) || !next.IsZero() {
		t.Fatalf("due at 100: %v, next %v; want [e], none", ids, next)
	}
}

// Many deadlines come back in order, each once.
func TestScheduleOrder(t *testing.T) {
	s := newSchedule()
	t0 := time.Unix(1_000_000, 0)
	const n = 1000
	for i := range n {
		// A permutation of 0..n-1.
		s.set(string(rune('a'+i%26))+string(rune(i)), t0.Add(time.Duration((i*7919)%n)*time.Millisecond))
	}
	ids, next := s.due(t0.Add(n * time.Millisecond))
	if len(ids) != n || !next.IsZero() {
		t.Fatalf("got %d due, next %v; want %d, none", len(ids), next, n)
	}
	var last time.Duration = -1
	for _, id := range ids {
		i := int([]rune(id)[1])
		d := time.Duration((i*7919)%n) * time.Millisecond
		if d <= last {
			t.Fatalf("%s at %v after %v: out of order", id, d, last)
		}
		last = d
	}
}
