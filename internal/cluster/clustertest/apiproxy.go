package clustertest

import (
	"fmt"
	"io"
	"net"
	"sync"
)

// apiProxy carries TCP from the nodes' network to the control plane,
// which listens on the host's loopback only (a node in its own network
// namespace has a loopback of its own): the API server's address on the
// nodes' "LAN", as on real hosts.
type apiProxy struct {
	ln     net.Listener
	target string
	wg     sync.WaitGroup
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
}

// startAPIProxy listens on addr (host:0) and forwards to target.
func startAPIProxy(addr, target string) (*apiProxy, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("control plane proxy: %w", err)
	}
	p := &apiProxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.serve()
	return p, nil
}

func (p *apiProxy) Addr() string { return p.ln.Addr().String() }

func (p *apiProxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		p.wg.Add(1)
		go p.pipe(c)
	}
}

// track records c until it is closed; false once the proxy is closing.
func (p *apiProxy) track(c net.Conn, on bool) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !on {
		delete(p.conns, c)
		return true
	}
	if p.conns == nil {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *apiProxy) pipe(c net.Conn) {
	defer p.wg.Done()
	defer c.Close()
	up, err := net.Dial("tcp", p.target)
	if err != nil {
		return
	}
	defer up.Close()
	if !p.track(c, true) || !p.track(up, true) {
		return
	}
	defer p.track(c, false)
	defer p.track(up, false)
	done := make(chan struct{}, 2)
	go func() { io.Copy(up, c); done <- struct{}{} }() // ends when either side closes: pipe closes both
	go func() { io.Copy(c, up); done <- struct{}{} }()
	<-done
	c.Close()
	up.Close()
	<-done
}

// Close stops listening, cuts every connection and waits for them.
func (p *apiProxy) Close() error {
	err := p.ln.Close()
	p.mu.Lock()
	for c := range p.conns {
		c.Close()
	}
	p.conns = nil
	p.mu.Unlock()
	p.wg.Wait()
	return err
}
