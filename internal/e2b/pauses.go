package e2b

import "sync"

// pauseTable follows the hibernations the endpoint makes, so that a
// process whose stream ended with one reattaches once the sandbox is back
// (see startProc). Each sandbox has an epoch, counted up by every
// hibernation, and, while it is hibernated, a channel closed at its wake.
type pauseTable struct {
	mu sync.Mutex
	m  map[string]*pauseState
}

type pauseState struct {
	epoch int
	woke  chan struct{} // nil while awake
}

func newPauseTable() *pauseTable { return &pauseTable{m: map[string]*pauseState{}} }

// begin records a hibernation of sandbox id starting.
func (t *pauseTable) begin(id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	ps := t.m[id]
	if ps == nil {
		ps = &pauseState{}
		t.m[id] = ps
	}
	ps.epoch++
	if ps.woke == nil {
		ps.woke = make(chan struct{})
	}
}

// end records sandbox id awake (or gone): waiters go on.
func (t *pauseTable) end(id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if ps := t.m[id]; ps != nil && ps.woke != nil {
		close(ps.woke)
		ps.woke = nil
	}
}

// paused reports whether sandbox id is hibernated by the endpoint.
func (t *pauseTable) paused(id string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	ps := t.m[id]
	return ps != nil && ps.woke != nil
}

// state returns sandbox id's epoch and, while it is hibernated, what
// closes at its wake (nil: awake).
func (t *pauseTable) state(id string) (int, <-chan struct{}) {
	t.mu.Lock()
	defer t.mu.Unlock()
	ps := t.m[id]
	if ps == nil {
		return 0, nil
	}
	if ps.woke == nil {
		return ps.epoch, nil
	}
	return ps.epoch, ps.woke
}

// drop forgets sandbox id (it is killed), letting waiters go on.
func (t *pauseTable) drop(id string) {
	t.end(id)
	t.mu.Lock()
	delete(t.m, id)
	t.mu.Unlock()
}
