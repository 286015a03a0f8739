package dnsproxy

import (
	"net/netip"
	"sync"
)

// shares hands out the slots of a pool (upstream queries, TCP connections)
// to sources: a source holds its share, and takes more only while more
// than a quarter of the pool (at least one slot) stays free for the
// others. A source whose allowed zone never answers, or that opens
// connections and leaves them idle, cannot hold the whole pool; one
// resolving many names at once may use what nobody else does.
type shares struct {
	size, share int

	mu   sync.Mutex
	used int
	of   map[netip.Addr]int
}

func newShares(size, share int) *shares {
	return &shares{size: size, share: share, of: map[netip.Addr]int{}}
}

// take takes a slot for src, or says none is to be had.
func (s *shares) take(src netip.Addr) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	free := s.size - s.used
	if free == 0 || (s.of[src] >= s.share && free <= max(s.size/4, 1)) {
		return false
	}
	s.used++
	s.of[src]++
	return true
}

// give gives back a slot src took.
func (s *shares) give(src netip.Addr) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.used--
	if s.of[src]--; s.of[src] <= 0 {
		delete(s.of, src)
	}
}
