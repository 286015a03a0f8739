package dnsproxy

import (
	"context"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/miekg/dns"
)

// ServeDNS answers one query from a sandbox.
func (p *Proxy) ServeDNS(w dns.ResponseWriter, r *dns.Msg) {
	src := remoteAddr(w.RemoteAddr())
	reply := func(rcode int, answer []dns.RR) {
		m := new(dns.Msg)
		m.SetRcode(r, rcode)
		m.RecursionAvailable = true
		m.Answer = answer
		if _, udp := w.RemoteAddr().(*net.UDPAddr); udp {
			size := dns.MinMsgSize
			if o := r.IsEdns0(); o != nil && int(o.UDPSize()) > size {
				size = min(int(o.UDPSize()), dns.DefaultMsgSize)
			}
			m.Truncate(size)
		}
		if err := w.WriteMsg(m); err != nil {
			p.log.Debug("dns proxy: write reply", slog.String("client", src.String()), slog.Any("error", err))
		}
	}
	if !src.IsValid() || !p.allow(src) {
		reply(dns.RcodeRefused, nil)
		return
	}
	allow, deny, ok := p.cfg.Policies.Names(src)
	if !ok {
		reply(dns.RcodeRefused, nil)
		return
	}
	if r.Opcode != dns.OpcodeQuery || len(r.Question) != 1 || r.Len() > maxQuerySize {
		reply(dns.RcodeFormatError, nil)
		return
	}
	q := r.Question[0]
	if q.Qclass != dns.ClassINET {
		reply(dns.RcodeRefused, nil)
		return
	}
	if p.cfg.MatchName(deny, q.Name) || !p.cfg.MatchName(allow, q.Name) {
		p.log.Debug("dns proxy: name not allowed", slog.String("client", src.String()), slog.String("name", q.Name))
		reply(dns.RcodeNameError, nil)
		return
	}
	if q.Qtype != dns.TypeA {
		// Sandbox networks are IPv4 only: an allowed name has no other
		// data for them (an empty answer, so clients go on with A).
		reply(dns.RcodeSuccess, nil)
		return
	}
	if !p.upstream.take(src) {
		reply(dns.RcodeServerFailure, nil)
		return
	}
	defer p.upstream.give(src)
	ctx, cancel := context.WithTimeout(p.ctx, 2*p.cfg.Timeout)
	defer cancel()
	resp, err := p.forward(ctx, q)
	if err != nil {
		p.log.Warn("dns proxy: upstream", slog.String("name", q.Name), slog.String("upstream", p.cfg.Upstream), slog.Any("error", err))
		reply(dns.RcodeServerFailure, nil)
		return
	}
	answer, addrs, ttl, denied := p.filter(resp, q.Name, deny)
	if denied != "" {
		// Deny wins over allow on the whole chain: an allowed name that
		// is an alias of a denied one does not lead there.
		p.log.Debug("dns proxy: answer leads to a denied name", slog.String("client", src.String()), slog.String("name", q.Name), slog.String("denied", denied))
		reply(dns.RcodeNameError, nil)
		return
	}
	if len(addrs) > 0 {
		kept, err := p.cfg.Policies.AddResolved(ctx, src, q.Name, addrs, p.timeout(ttl))
		switch {
		case errdefs.IsFailedPrecondition(err): // the policy changed meanwhile
			reply(dns.RcodeNameError, nil)
			return
		case err != nil:
			p.log.Warn("dns proxy: allow resolved addresses", slog.String("client", src.String()), slog.String("name", q.Name), slog.Any("error", err))
			reply(dns.RcodeServerFailure, nil)
			return
		}
		if len(kept) < len(addrs) {
			p.log.Debug("dns proxy: addresses left out of an answer", slog.String("client", src.String()), slog.String("name", q.Name),
				slog.Int("answered", len(addrs)), slog.Int("kept", len(kept)))
			answer = keepAddrs(answer, kept)
		}
	}
	reply(resp.Rcode, answer)
}

// forward asks the upstream resolver for the A records of q's name, over
// UDP, then TCP if the answer was truncated. The sandbox's own message is
// not passed on: only its question.
func (p *Proxy) forward(ctx context.Context, q dns.Question) (*dns.Msg, error) {
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(q.Name), dns.TypeA)
	m.SetEdns0(dns.DefaultMsgSize, false)
	c := &dns.Client{Net: "udp", Timeout: p.cfg.Timeout}
	resp, err := exchange(ctx, c, m, p.cfg.Upstream)
	if err == nil && resp.Truncated {
		c.Net = "tcp"
		resp, err = exchange(ctx, c, m, p.cfg.Upstream)
	}
	return resp, err
}

// exchange is c.ExchangeContext that also ends when ctx does (Close):
// the dns package only takes ctx's deadline.
func exchange(ctx context.Context, c *dns.Client, m *dns.Msg, upstream string) (*dns.Msg, error) {
	conn, err := c.DialContext(ctx, upstream)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	resp, _, err := c.ExchangeWithConnContext(ctx, m, conn)
	return resp, err
}

// filter keeps the answer's CNAME and A records that follow the chain
// from qname (TTLs capped at MaxTTL) and returns the addresses and their
// smallest TTL. A record of another name is dropped: it would allow an
// address nobody asked for. denied is the first name of the chain on the
// deny list ("" if none): the caller answers NXDOMAIN then.
func (p *Proxy) filter(resp *dns.Msg, qname string, deny []string) (out []dns.RR, addrs []netip.Addr, ttl time.Duration, denied string) {
	chain := map[string]bool{canonical(qname): true}
	// The chain, whatever the order of its records (a message holds at
	// most a few hundred; each pass adds a name or ends).
	for grown := true; grown; {
		grown = false
		for _, rr := range resp.Answer {
			if c, ok := rr.(*dns.CNAME); ok && c.Hdr.Class == dns.ClassINET && chain[canonical(c.Hdr.Name)] && !chain[canonical(c.Target)] {
				chain[canonical(c.Target)] = true
				grown = true
			}
		}
	}
	for name := range chain {
		if p.cfg.MatchName(deny, name) {
			return nil, nil, 0, name
		}
	}
	maxTTL := uint32(p.cfg.MaxTTL / time.Second)
	minTTL := maxTTL
	for _, rr := range resp.Answer {
		h := rr.Header()
		if h.Class != dns.ClassINET || !chain[canonical(h.Name)] {
			continue
		}
		switch v := rr.(type) {
		case *dns.A:
			a, ok := netip.AddrFromSlice(v.A.To4())
			if !ok {
				continue
			}
			addrs = append(addrs, a)
			minTTL = min(minTTL, h.Ttl)
		case *dns.CNAME:
		default:
			continue
		}
		h.Ttl = min(h.Ttl, maxTTL)
		out = append(out, rr)
	}
	return out, addrs, time.Duration(minTTL) * time.Second, ""
}

// canonical is name as the chain compares it: lower case, fully qualified.
func canonical(name string) string { return strings.ToLower(dns.Fqdn(name)) }

// keepAddrs drops the A records of answer whose address is not in kept:
// the sandbox is not told of an address it may not reach.
func keepAddrs(answer []dns.RR, kept []netip.Addr) []dns.RR {
	out := answer[:0:0]
	for _, rr := range answer {
		if a, ok := rr.(*dns.A); ok {
			addr, _ := netip.AddrFromSlice(a.A.To4())
			if !slices.Contains(kept, addr) {
				continue
			}
		}
		out = append(out, rr)
	}
	return out
}

// timeout is how long resolved addresses stay reachable: their TTL, within
// [MinTTL, MaxTTL]. Never shorter than the TTL the sandbox was given, so an
// answer it caches stays usable; connections made meanwhile outlive it.
func (p *Proxy) timeout(ttl time.Duration) time.Duration {
	return min(max(ttl, p.cfg.MinTTL), p.cfg.MaxTTL)
}

func remoteAddr(a net.Addr) netip.Addr {
	switch v := a.(type) {
	case *net.UDPAddr:
		return v.AddrPort().Addr().Unmap()
	case *net.TCPAddr:
		return v.AddrPort().Addr().Unmap()
	}
	return netip.Addr{}
}
