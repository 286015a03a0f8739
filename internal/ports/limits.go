package ports

import (
	"container/list"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http/httpguts"
)

// Bounds on what one sandbox's link holders, and the listener's clients
// together, can hold open: a cap on the listener's connections, a cap on
// those each sandbox's requests hold (so that one link holder, whose app
// answers slowly, leaves the others room; a connection kept alive with
// no request in flight is closed to make room for another of its
// sandbox's), a cap on each sandbox's upgraded connections, and an idle
// deadline on every connection (so on every WebSocket and tunnel).

// connKey is the context key of a request's connection, an *idleConn
// (the Server's ConnContext puts it there).
type connKey struct{}

// hold is a connection's: the sandbox of its last allowed request, and
// whether a request of that sandbox is in flight on it.
type hold struct {
	id   string
	busy bool
}

// holdConn counts c as held by sandbox id, busy with a request, until the
// request is done (requestDone) and then, kept alive, until it carries a
// request for another sandbox or closes. When id holds MaxSandboxConns
// already, one of them with no request in flight is closed for c; ok is
// false when all of them have one.
func (h *Handler) holdConn(c *idleConn, id string) (ok bool) {
	var evict *idleConn
	defer func() {
		if evict != nil {
			evict.Close() // outside h.mu: its connClosed takes it
		}
	}()
	h.mu.Lock()
	defer h.mu.Unlock()
	cur := h.holder[c]
	if cur != nil && cur.id == id {
		cur.busy = true
		return true
	}
	if h.conns[id] >= h.o.MaxSandboxConns {
		for oc, o := range h.holder {
			if o.id == id && !o.busy {
				evict = oc
				break
			}
		}
		if evict == nil {
			return false
		}
		delete(h.holder, evict) // its close finds no hold
		h.dropLocked(id)
	}
	if c.closed.Load() { // closing: connClosed has run or will find nothing
		return true
	}
	if cur != nil {
		h.dropLocked(cur.id)
	}
	h.holder[c] = &hold{id: id, busy: true}
	h.conns[id]++
	return true
}

// requestDone marks c's request done: c, kept alive, may be closed to
// make room for another connection of its sandbox's.
func (h *Handler) requestDone(c *idleConn) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if cur := h.holder[c]; cur != nil {
		cur.busy = false
	}
}

// connClosed drops c's hold, if a sandbox has it.
func (h *Handler) connClosed(c *idleConn) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if cur, ok := h.holder[c]; ok {
		delete(h.holder, c)
		h.dropLocked(cur.id)
	}
}

func (h *Handler) dropLocked(id string) {
	if h.conns[id]--; h.conns[id] <= 0 {
		delete(h.conns, id)
	}
}

// isUpgrade says r asks to switch protocols (a WebSocket): the reverse
// proxy then holds the connection for as long as it lasts.
func isUpgrade(r *http.Request) bool {
	return r.Header.Get("Upgrade") != "" && httpguts.HeaderValuesContainsToken(r.Header["Connection"], "Upgrade")
}

// upgradeSlot takes one of sandbox id's MaxUpgrades slots for a WebSocket or
// tunnel; ok is false when all are taken.
func (h *Handler) upgradeSlot(id string) (release func(), ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.upgrades[id] >= h.o.MaxUpgrades {
		return nil, false
	}
	h.upgrades[id]++
	var once sync.Once
	return func() {
		once.Do(func() {
			h.mu.Lock()
			defer h.mu.Unlock()
			if h.upgrades[id]--; h.upgrades[id] <= 0 {
				delete(h.upgrades, id)
			}
		})
	}, true
}

// sanitizeResponse removes from an app's response headers what would reach
// beyond its own sandbox port: Service-Worker-Allowed (a service worker
// scoped above its script's path would, in the path form, capture every
// sandbox's pages and links), and the Domain attribute of its cookies (a
// cookie for the parent domain would be sent to every other sandbox's
// host).
func sanitizeResponse(hdr http.Header) {
	hdr.Del("Service-Worker-Allowed")
	cs := hdr.Values("Set-Cookie")
	if len(cs) == 0 {
		return
	}
	out := make([]string, 0, len(cs))
	for _, c := range cs {
		parts := strings.Split(c, ";")
		keep := parts[:1]
		for _, p := range parts[1:] {
			name, _, _ := strings.Cut(strings.TrimSpace(p), "=")
			if !strings.EqualFold(strings.TrimSpace(name), "domain") {
				keep = append(keep, p)
			}
		}
		out = append(out, strings.Join(keep, ";"))
	}
	hdr["Set-Cookie"] = out
}

// limitListener holds at most max connections at a time and closes a
// connection that moves no byte for idle; closed, if set, learns of each
// connection's close before its slot is free. When all slots are taken, a
// new connection closes the oldest that has not yet carried a request
// (fresh): one that sends nothing, or its headers a byte at a time, would
// hold its slot until the server's header timeout, and a flood of them
// would keep every caller out. Each such connection now makes room only
// for a later one, while a caller's connection carries its request as soon
// as it opens. With no fresh connection, the new one waits for a slot.
type limitListener struct {
	net.Listener
	idle   time.Duration
	slots  chan struct{}
	done   chan struct{}
	once   sync.Once
	closed func(*idleConn)

	mu    sync.Mutex
	fresh list.List // of *idleConn, oldest first
}

func newLimitListener(l net.Listener, max int, idle time.Duration, closed func(*idleConn)) *limitListener {
	return &limitListener{Listener: l, idle: idle, slots: make(chan struct{}, max), done: make(chan struct{}), closed: closed}
}

func (l *limitListener) Accept() (net.Conn, error) {
	select {
	case <-l.done:
		return nil, net.ErrClosed
	default:
	}
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	select {
	case l.slots <- struct{}{}:
	default:
		if oldest := l.oldestFresh(); oldest != nil {
			oldest.Close() // frees its slot
		}
		select {
		case l.slots <- struct{}{}:
		case <-l.done:
			c.Close()
			return nil, net.ErrClosed
		}
	}
	ic := &idleConn{Conn: c, idle: l.idle, l: l}
	ic.release = func() {
		if l.closed != nil {
			l.closed(ic)
		}
		<-l.slots
	}
	ic.timer = time.AfterFunc(l.idle, func() { ic.Close() })
	l.mu.Lock()
	if !ic.closed.Load() { // its idle timer may have fired already
		ic.fresh = l.fresh.PushBack(ic)
	}
	l.mu.Unlock()
	return ic, nil
}

// oldestFresh takes the oldest connection that has carried no request off
// the fresh list; nil when there is none.
func (l *limitListener) oldestFresh() *idleConn {
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.fresh.Front()
	if e == nil {
		return nil
	}
	ic := l.fresh.Remove(e).(*idleConn)
	ic.fresh = nil
	return ic
}

// notFresh takes c off the fresh list, if it is on it.
func (l *limitListener) notFresh(c *idleConn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if c.fresh != nil {
		l.fresh.Remove(c.fresh)
		c.fresh = nil
	}
}

func (l *limitListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// idleConn is a connection that closes itself after idle without a read or
// a write returning, or one starting. A read blocked for idle counts as
// idle: that is what ends a WebSocket or tunnel nobody uses.
type idleConn struct {
	net.Conn
	idle    time.Duration
	timer   *time.Timer
	once    sync.Once
	closed  atomic.Bool
	release func()
	l       *limitListener
	fresh   *list.Element // on l.fresh until it carries a request (l.mu)
}

// served says a request came whole on c: it is no longer the first closed
// to make room for a new connection.
func (c *idleConn) served() {
	if c.l != nil {
		c.l.notFresh(c)
	}
}

// touch restarts the idle clock.
func (c *idleConn) touch() {
	if !c.closed.Load() {
		c.timer.Reset(c.idle)
	}
}

func (c *idleConn) Read(b []byte) (int, error) {
	c.touch()
	n, err := c.Conn.Read(b)
	c.touch()
	return n, err
}

func (c *idleConn) Write(b []byte) (int, error) {
	c.touch()
	n, err := c.Conn.Write(b)
	c.touch()
	return n, err
}

// CloseWrite passes a half-close on (a tunnel's).
func (c *idleConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return c.Close()
}

func (c *idleConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.closed.Store(true); c.timer.Stop(); c.served(); c.release() })
	return err
}
