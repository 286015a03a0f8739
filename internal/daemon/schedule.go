package daemon

import (
	"container/heap"
	"sync"
	"time"
)

// schedule is the expiry scheduler's book: every live sandbox it tracks,
// and a min-heap of those with a deadline, so the one goroutine that runs
// expiry (expiry.go) sleeps until the nearest deadline whatever the number
// of sandboxes. It does no I/O; every change kicks the goroutine so that it
// recomputes its wake-up.
type schedule struct {
	mu      sync.Mutex
	entries map[string]*lifeEntry
	heap    deadlineHeap
	kick    chan struct{}
}

// lifeEntry is one tracked sandbox.
type lifeEntry struct {
	id string
	at time.Time // zero: no deadline (then not in the heap)
	// index in the heap, -1 when not in it.
	index int
	// expiring: an expiry of this sandbox is queued or under way; the
	// idle scan leaves it alone.
	expiring bool
}

func newSchedule() *schedule {
	return &schedule{entries: map[string]*lifeEntry{}, kick: make(chan struct{}, 1)}
}

// set tracks sandbox id with deadline at (zero: none).
func (s *schedule) set(id string, at time.Time) {
	s.mu.Lock()
	e, ok := s.entries[id]
	if !ok {
		e = &lifeEntry{id: id, index: -1}
		s.entries[id] = e
	}
	e.at = at
	switch {
	case at.IsZero() && e.index >= 0:
		heap.Remove(&s.heap, e.index)
	case !at.IsZero() && e.index < 0:
		heap.Push(&s.heap, e)
	case !at.IsZero():
		heap.Fix(&s.heap, e.index)
	}
	s.mu.Unlock()
	s.wake()
}

// remove stops tracking sandbox id.
func (s *schedule) remove(id string) {
	s.mu.Lock()
	if e, ok := s.entries[id]; ok {
		if e.index >= 0 {
			heap.Remove(&s.heap, e.index)
		}
		delete(s.entries, id)
	}
	s.mu.Unlock()
}

// deadline returns sandbox id's scheduled deadline and whether it is
// tracked.
func (s *schedule) deadline(id string) (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.entries[id]
	if !ok {
		return time.Time{}, false
	}
	return e.at, true
}

// len is how many sandboxes are tracked and how many have a deadline.
func (s *schedule) len() (tracked, withDeadline int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.entries), len(s.heap)
}

func (s *schedule) wake() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// due takes off the heap every sandbox whose deadline is at or before now
// and marks it expiring; next is the nearest deadline left (zero: none).
func (s *schedule) due(now time.Time) (ids []string, next time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for len(s.heap) > 0 && !s.heap[0].at.After(now) {
		e := heap.Pop(&s.heap).(*lifeEntry)
		e.at, e.expiring = time.Time{}, true
		ids = append(ids, e.id)
	}
	if len(s.heap) > 0 {
		next = s.heap[0].at
	}
	return ids, next
}

// idleCandidates returns the tracked sandboxes not being expired.
func (s *schedule) idleCandidates() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.entries))
	for id, e := range s.entries {
		if !e.expiring {
			out = append(out, id)
		}
	}
	return out
}

// markExpiring marks sandbox id expiring; false if it is already (or not
// tracked).
func (s *schedule) markExpiring(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.entries[id]
	if !ok || e.expiring {
		return false
	}
	e.expiring = true
	return true
}

// expired ends an expiry of sandbox id (its outcome was set or removed).
func (s *schedule) expired(id string) {
	s.mu.Lock()
	if e, ok := s.entries[id]; ok {
		e.expiring = false
	}
	s.mu.Unlock()
	s.wake()
}

// deadlineHeap orders entries by deadline (container/heap).
type deadlineHeap []*lifeEntry

func (h deadlineHeap) Len() int           { return len(h) }
func (h deadlineHeap) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h deadlineHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}
func (h *deadlineHeap) Push(x any) {
	e := x.(*lifeEntry)
	e.index = len(*h)
	*h = append(*h, e)
}
func (h *deadlineHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = nil
	e.index = -1
	*h = old[:len(old)-1]
	return e
}
