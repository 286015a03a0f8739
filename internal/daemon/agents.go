package daemon

import (
	"net/netip"
	"sync"

	"github.com/forkbox/forkbox/internal/agent"
	"github.com/forkbox/forkbox/internal/store"
)

// agents holds one session client per sandbox (see agent.NewSessionClient):
// an exec costs no dial and no handshake. A client is kept for its
// sandbox's address and token; when either changes a new one takes its
// place, and the old one (calls may still run on it) is retired, to be
// closed with the sandbox's others by drop. A memory-forked child never
// gets its source's client: clients are per sandbox ID, the fork notice
// goes over a connection of its own (agentWithToken), and the source's
// clients are dropped before its memory is checkpointed, so that no child
// wakes holding a live session of the source's.
type agents struct {
	mu sync.Mutex
	m  map[string]*agentClients
}

type agentClients struct {
	cur     *agent.Client
	retired []*agent.Client
}

// agent returns the session client for a sandbox's agent.
func (d *Daemon) agent(sb *store.Sandbox) *agent.Client {
	addr := d.host.AgentAddr(sb.ID, netip.MustParseAddr(sb.IP))
	a := &d.agentClients
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.m == nil {
		a.m = map[string]*agentClients{}
	}
	e := a.m[sb.ID]
	if e == nil {
		e = &agentClients{}
		a.m[sb.ID] = e
	}
	if e.cur != nil && e.cur.Addr() == addr && e.cur.Token() == sb.AgentToken {
		return e.cur
	}
	if e.cur != nil {
		e.retired = append(e.retired, e.cur)
	}
	e.cur = agent.NewSessionClient(addr, sb.AgentToken)
	return e.cur
}

// agentWithToken is a client with another token (a memory-forked child's
// agent wakes with its source's) that opens a connection per call.
func (d *Daemon) agentWithToken(sb *store.Sandbox, token string) *agent.Client {
	return agent.NewClient(d.host.AgentAddr(sb.ID, netip.MustParseAddr(sb.IP)), token)
}

// dropAgent closes a sandbox's clients (its sessions end; calls still on
// them fail): before its memory is checkpointed and when it is torn down.
func (d *Daemon) dropAgent(id string) {
	a := &d.agentClients
	a.mu.Lock()
	e := a.m[id]
	delete(a.m, id)
	a.mu.Unlock()
	if e == nil {
		return
	}
	for _, c := range append(e.retired, e.cur) {
		if c != nil {
			c.Close()
		}
	}
}

// closeAgents closes every client (the daemon's Close).
func (d *Daemon) closeAgents() {
	a := &d.agentClients
	a.mu.Lock()
	ids := make([]string, 0, len(a.m))
	for id := range a.m {
		ids = append(ids, id)
	}
	a.mu.Unlock()
	for _, id := range ids {
		d.dropAgent(id)
	}
}
