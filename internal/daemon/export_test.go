package daemon

import "testing"

// SilentAgentFixture serves the tests outside the package (daemon_test,
// which may import what is built on the daemon, such as the E2B
// endpoint): a daemon on the fake host with one sandbox whose agent never
// answers requests of one op (serveSilentAgent).
type SilentAgentFixture struct {
	D  *Daemon
	ID string
	// Took receives each op the agent reads, Ended each silent op whose
	// connection ended: the caller gave up on it.
	Took, Ended <-chan string
}

// NewSilentAgentFixture makes the fixture, its agent silent on op.
func NewSilentAgentFixture(t *testing.T, op string) *SilentAgentFixture {
	t.Helper()
	h := newHarness(t)
	id := h.create(CreateOptions{})
	a := serveSilentAgent(t, op)
	h.useAgent(id, a.addr)
	return &SilentAgentFixture{D: h.d, ID: id, Took: a.tookc, Ended: a.ended}
}
