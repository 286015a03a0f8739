// Package dnsproxy is the host's DNS proxy for sandboxes with egress allow
// lists: one per daemon, on the bridge's gateway address, port 53. It
// answers a sandbox only for the names on its allow list (exact names and
// "*.example.com" wildcards, deny winning), forwards those to the host's
// upstream resolver, and before answering lets the sandbox reach the
// addresses in the answer (Policies.AddResolved, an nftables set element
// with a timeout from the TTL). Private and reserved addresses in an answer
// (DNS rebinding: an allowed name answering 10.0.0.5) are left out of the
// answer and never allowed, unless a CIDR on the sandbox's allow list
// covers them (network.PublicAddr has the list). Every other name gets NXDOMAIN; a source
// that is not such a sandbox, or that asks too fast, gets REFUSED.
//
// Everything a sandbox sends is bounded: one question per query, 512 bytes
// over UDP (the server's buffer), a rate per sandbox, a number of queries
// upstream at once and a share of them per sandbox, TCP connections, their
// queries and their time.
package dnsproxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"syscall"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/miekg/dns"
	"golang.org/x/sys/unix"
	"golang.org/x/time/rate"
)

// Policies is what the proxy knows of sandboxes: a *network.Manager.
type Policies interface {
	// Names returns the allowed and denied names of the sandbox at src,
	// and false when src is no sandbox that resolves through the proxy.
	Names(src netip.Addr) (allow, deny []string, ok bool)
	// AddResolved lets the sandbox at src reach those of addrs, resolved
	// for name, that its policy permits (public addresses, or ones a CIDR
	// on its allow list covers), for timeout, and returns them. It checks
	// name against the sandbox's policy again.
	AddResolved(ctx context.Context, src netip.Addr, name string, addrs []netip.Addr, timeout time.Duration) ([]netip.Addr, error)
}

// Config configures a Proxy. Zero values take the defaults.
type Config struct {
	Listen netip.AddrPort // UDP and TCP; port 0 picks one (tests)
	// Device, if set, binds the sockets to that interface as well
	// (SO_BINDTODEVICE): the proxy answers only what comes in by it.
	Device string
	// Clients, if valid, is where sandboxes are: queries from elsewhere
	// are refused before a rate limiter is made for them.
	Clients  netip.Prefix
	Upstream string // host:port of the resolver names are forwarded to
	Policies Policies
	// MatchName reports whether q matches one of names (network.MatchName).
	MatchName func(names []string, q string) bool
	Log       *slog.Logger
	Rate      float64       // queries per second per sandbox, default 20
	Burst     int           // default 50
	MinTTL    time.Duration // shortest set timeout, default 30s
	MaxTTL    time.Duration // longest set timeout and answer TTL, default 1h
	Timeout   time.Duration // of an upstream query, default 2s
	// Inflight bounds the queries upstream at once, default 64; more are
	// answered SERVFAIL at once.
	Inflight int
	// InflightPerSource is one sandbox's share of them, default an eighth
	// of Inflight (at least 1): past it, a sandbox takes more only while
	// more than a quarter are free, so that one whose allow list names a
	// zone that never answers cannot hold them all.
	InflightPerSource int
	// TCPTimeout bounds a TCP connection's reads, writes and idle time,
	// default 3s.
	TCPTimeout time.Duration
}

// Bounds on what a sandbox sends.
const (
	maxQuerySize         = 512 // bytes, over UDP and TCP
	maxTCPConns          = 64
	maxTCPConnsPerSource = 8 // of maxTCPConns, and more while a quarter stay free
	maxTCPQueries        = 8
	maxLimiters          = 1 << 16 // rate limiters kept (one per source address)
)

// Proxy is a running DNS proxy. Close stops it.
type Proxy struct {
	cfg    Config
	log    *slog.Logger
	udp    *dns.Server
	tcp    *dns.Server
	addr   netip.AddrPort
	ctx    context.Context // cancelled by Close: upstream queries stop
	cancel context.CancelFunc
	wg     sync.WaitGroup

	upstream *shares // the Inflight upstream queries

	mu       sync.Mutex
	limiters map[netip.Addr]*rate.Limiter
}

// Start listens on cfg.Listen (UDP, then TCP on the same port) and serves
// until Close.
func Start(ctx context.Context, cfg Config) (*Proxy, error) {
	if cfg.Policies == nil || cfg.MatchName == nil || cfg.Upstream == "" {
		return nil, fmt.Errorf("dnsproxy: policies, matcher and upstream are required: %w", errdefs.ErrInvalidArgument)
	}
	if _, _, err := net.SplitHostPort(cfg.Upstream); err != nil {
		return nil, fmt.Errorf("dnsproxy: upstream %q: want host:port: %w", cfg.Upstream, errdefs.ErrInvalidArgument)
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.Rate == 0 {
		cfg.Rate = 20
	}
	if cfg.Burst == 0 {
		cfg.Burst = 50
	}
	if cfg.MinTTL == 0 {
		cfg.MinTTL = 30 * time.Second
	}
	if cfg.MaxTTL == 0 {
		cfg.MaxTTL = time.Hour
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 2 * time.Second
	}
	if cfg.Inflight == 0 {
		cfg.Inflight = 64
	}
	if cfg.TCPTimeout == 0 {
		cfg.TCPTimeout = 3 * time.Second
	}
	if cfg.InflightPerSource == 0 {
		cfg.InflightPerSource = max(cfg.Inflight/8, 1)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var lc net.ListenConfig
	if cfg.Device != "" {
		lc.Control = bindToDevice(cfg.Device)
	}
	pc, ln, addr, err := listenPair(ctx, &lc, cfg)
	if err != nil {
		return nil, err
	}
	p := &Proxy{cfg: cfg, log: cfg.Log, addr: netip.AddrPortFrom(addr.Addr().Unmap(), addr.Port()),
		limiters: map[netip.Addr]*rate.Limiter{}, upstream: newShares(cfg.Inflight, cfg.InflightPerSource)}
	p.ctx, p.cancel = context.WithCancel(context.WithoutCancel(ctx))
	started := make(chan struct{}, 2)
	notify := func() { started <- struct{}{} }
	p.udp = &dns.Server{PacketConn: pc, Handler: p, UDPSize: maxQuerySize, NotifyStartedFunc: notify}
	tcpTimeout := cfg.TCPTimeout
	p.tcp = &dns.Server{Listener: &limitListener{Listener: ln, sem: make(chan struct{}, maxTCPConns), done: make(chan struct{}),
		shares: newShares(maxTCPConns, maxTCPConnsPerSource)}, Handler: p,
		ReadTimeout: tcpTimeout, WriteTimeout: tcpTimeout, MaxTCPQueries: maxTCPQueries,
		IdleTimeout: func() time.Duration { return tcpTimeout }, NotifyStartedFunc: notify}
	errc := make(chan error, 2)
	for _, s := range []*dns.Server{p.udp, p.tcp} {
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			if err := s.ActivateAndServe(); err != nil {
				errc <- err
			}
		}()
	}
	for range 2 {
		select {
		case <-started:
		case err := <-errc:
			p.cancel()
			pc.Close()
			ln.Close()
			p.wg.Wait()
			return nil, fmt.Errorf("dnsproxy: serve: %v: %w", err, errdefs.ErrUnavailable)
		}
	}
	p.log.Info("dns proxy listening", slog.String("addr", p.addr.String()), slog.String("upstream", cfg.Upstream))
	return p, nil
}

// Addr is where the proxy listens (UDP and TCP).
func (p *Proxy) Addr() netip.AddrPort { return p.addr }

// Close stops the proxy and waits for its handlers.
func (p *Proxy) Close() error {
	p.cancel()
	err := errors.Join(p.udp.Shutdown(), p.tcp.Shutdown())
	p.wg.Wait()
	return err
}

// bindToDevice is a ListenConfig.Control binding the socket to dev.
func bindToDevice(dev string) func(network, address string, c syscall.RawConn) error {
	return func(_, _ string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) { serr = unix.BindToDevice(int(fd), dev) }); err != nil {
			return err
		}
		if serr != nil {
			return fmt.Errorf("bind to device %s: %w", dev, serr)
		}
		return nil
	}
}

// allow takes a token of src's rate limiter. A source outside Clients is
// refused without one (random sources cannot fill the map).
func (p *Proxy) allow(src netip.Addr) bool {
	if p.cfg.Clients.IsValid() && !p.cfg.Clients.Contains(src) {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	l, ok := p.limiters[src]
	if !ok {
		if len(p.limiters) >= maxLimiters {
			clear(p.limiters) // a flood of sources: start again
		}
		l = rate.NewLimiter(rate.Limit(p.cfg.Rate), p.cfg.Burst)
		p.limiters[src] = l
	}
	return l.Allow()
}

// limitListener bounds the TCP connections open at once: Accept waits for
// one to close. A source past its share has its next one closed at once
// when no more than a quarter are free (shares).
type limitListener struct {
	net.Listener
	sem    chan struct{}
	once   sync.Once
	done   chan struct{}
	shares *shares
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		select {
		case l.sem <- struct{}{}:
		case <-l.done:
			return nil, net.ErrClosed
		}
		c, err := l.Listener.Accept()
		if err != nil {
			<-l.sem
			return nil, err
		}
		src := remoteAddr(c.RemoteAddr())
		if !l.shares.take(src) {
			c.Close()
			<-l.sem
			continue
		}
		return &limitConn{Conn: c, release: sync.OnceFunc(func() {
			l.shares.give(src)
			<-l.sem
		})}, nil
	}
}

type limitConn struct {
	net.Conn
	release func()
}

func (l *limitListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return l.Listener.Close()
}

func (c *limitConn) Close() error { c.release(); return c.Conn.Close() }

// listenPair binds UDP and TCP on one address. With port 0 the kernel
// picks a UDP port that TCP may hold already (another process's
// listener): then a new pair is tried, a bounded number of times.
func listenPair(ctx context.Context, lc *net.ListenConfig, cfg Config) (net.PacketConn, net.Listener, netip.AddrPort, error) {
	for try := 0; ; try++ {
		pc, err := lc.ListenPacket(ctx, "udp", cfg.Listen.String())
		if err != nil {
			return nil, nil, netip.AddrPort{}, fmt.Errorf("dnsproxy: listen udp %s (device %q): %v: %w", cfg.Listen, cfg.Device, err, errdefs.ErrUnavailable)
		}
		addr := pc.LocalAddr().(*net.UDPAddr).AddrPort()
		ln, err := lc.Listen(ctx, "tcp", addr.String())
		if err == nil {
			return pc, ln, addr, nil
		}
		pc.Close()
		if cfg.Listen.Port() != 0 || !errors.Is(err, syscall.EADDRINUSE) || try == 20 {
			return nil, nil, netip.AddrPort{}, fmt.Errorf("dnsproxy: listen tcp %s: %v: %w", addr, err, errdefs.ErrUnavailable)
		}
	}
}
