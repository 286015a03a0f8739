package dnsproxy

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/network"
	"github.com/miekg/dns"
)

// fakeUpstream is a resolver on loopback: allowed.test, denied.test and
// anything below wild.test have A records (TEST-NET-2 addresses: public to
// network.PublicAddr); rebind.test answers a private address and a public
// one; slow.test never answers.
type fakeUpstream struct {
	queries atomic.Int64
	slow    atomic.Int64 // queries for slow.test
	addr    string
}

func startUpstream(t *testing.T) *fakeUpstream {
	t.Helper()
	u := &fakeUpstream{}
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u.addr = pc.LocalAddr().String()
	block := make(chan struct{})
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		u.queries.Add(1)
		name := strings.ToLower(r.Question[0].Name)
		m := new(dns.Msg)
		m.SetReply(r)
		switch {
		case name == "slow.test.":
			u.slow.Add(1)
			<-block
			return
		case name == "hop.wild.test.": // an alias of a denied name
			m.Answer = append(m.Answer,
				&dns.CNAME{Hdr: dns.RR_Header{Name: name, Rrtype: dns.TypeCNAME, Class: dns.ClassINET, Ttl: 60}, Target: "mid.test."},
				&dns.A{Hdr: dns.RR_Header{Name: "bad.wild.test.", Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60}, A: net.IPv4(198, 51, 100, 10)},
				&dns.CNAME{Hdr: dns.RR_Header{Name: "MID.test.", Rrtype: dns.TypeCNAME, Class: dns.ClassINET, Ttl: 60}, Target: "bad.wild.test."})
		case name == "stray.wild.test.": // an A record of a name off the chain
			m.Answer = append(m.Answer,
				&dns.A{Hdr: dns.RR_Header{Name: "unrelated.test.", Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60}, A: net.IPv4(198, 51, 100, 11)},
				&dns.CNAME{Hdr: dns.RR_Header{Name: name, Rrtype: dns.TypeCNAME, Class: dns.ClassINET, Ttl: 60}, Target: "x.test."},
				&dns.A{Hdr: dns.RR_Header{Name: "x.test.", Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60}, A: net.IPv4(198, 51, 100, 12)})
		case name == "allowed.test." || name == "denied.test." || strings.HasSuffix(name, ".wild.test."):
			m.Answer = append(m.Answer,
				&dns.CNAME{Hdr: dns.RR_Header{Name: name, Rrtype: dns.TypeCNAME, Class: dns.ClassINET, Ttl: 7200}, Target: "target.test."},
				&dns.A{Hdr: dns.RR_Header{Name: "target.test.", Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 5}, A: net.IPv4(198, 51, 100, 7)},
				&dns.A{Hdr: dns.RR_Header{Name: "target.test.", Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 7200}, A: net.IPv4(198, 51, 100, 8)})
		case name == "rebind.test.":
			m.Answer = append(m.Answer,
				&dns.CNAME{Hdr: dns.RR_Header{Name: name, Rrtype: dns.TypeCNAME, Class: dns.ClassINET, Ttl: 60}, Target: "inside.corp."},
				&dns.A{Hdr: dns.RR_Header{Name: "inside.corp.", Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60}, A: net.IPv4(10, 0, 0, 5)},
				&dns.A{Hdr: dns.RR_Header{Name: "inside.corp.", Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60}, A: net.IPv4(198, 51, 100, 9)})
		default:
			m.Rcode = dns.RcodeNameError
		}
		w.WriteMsg(m)
	})}
	started := make(chan struct{})
	srv.NotifyStartedFunc = func() { close(started) }
	done := make(chan struct{})
	go func() { defer close(done); srv.ActivateAndServe() }()
	<-started
	t.Cleanup(func() { close(block); srv.Shutdown(); <-done })
	return u
}

type added struct {
	src     netip.Addr
	name    string
	addrs   []netip.Addr
	timeout time.Duration
}

// fakePolicies gives 127.0.0.1 an allow list; AddResolved records, keeps
// the public addresses (as network.Manager does for a list without
// CIDRs), or fails with err.
type fakePolicies struct {
	mu    sync.Mutex
	added []added
	err   error
}

func (f *fakePolicies) Names(src netip.Addr) ([]string, []string, bool) {
	if src != netip.MustParseAddr("127.0.0.1") && src != netip.MustParseAddr("127.0.0.3") {
		return nil, nil, false
	}
	return []string{"allowed.test", "*.wild.test", "slow.test", "rebind.test"}, []string{"bad.wild.test"}, true
}

func (f *fakePolicies) AddResolved(_ context.Context, src netip.Addr, name string, addrs []netip.Addr, timeout time.Duration) ([]netip.Addr, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return nil, f.err
	}
	f.added = append(f.added, added{src, name, addrs, timeout})
	var kept []netip.Addr
	for _, a := range addrs {
		if network.PublicAddr(a) {
			kept = append(kept, a)
		}
	}
	return kept, nil
}

func (f *fakePolicies) take() []added {
	f.mu.Lock()
	defer f.mu.Unlock()
	a := f.added
	f.added = nil
	return a
}

func startProxy(t *testing.T, pol Policies, upstream string, tune func(*Config)) *Proxy {
	t.Helper()
	cfg := Config{Listen: netip.MustParseAddrPort("127.0.0.1:0"), Upstream: upstream, Policies: pol,
		MatchName: network.MatchName, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Timeout: 30 * time.Second}
	if tune != nil {
		tune(&cfg)
	}
	p, err := Start(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return p
}

func query(t *testing.T, p *Proxy, from, name string, qtype uint16) *dns.Msg {
	t.Helper()
	c := &dns.Client{Net: "udp", Timeout: 30 * time.Second}
	if from != "" {
		c.Dialer = &net.Dialer{LocalAddr: &net.UDPAddr{IP: net.ParseIP(from)}, Timeout: 30 * time.Second}
	}
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), qtype)
	r, _, err := c.Exchange(m, p.Addr().String())
	if err != nil {
		t.Fatalf("query %s: %v", name, err)
	}
	return r
}

func TestProxyPolicy(t *testing.T) {
	up := startUpstream(t)
	pol := &fakePolicies{}
	p := startProxy(t, pol, up.addr, nil)

	// An allowed name: forwarded, answered, its addresses allowed first.
	r := query(t, p, "", "Allowed.Test", dns.TypeA)
	if r.Rcode != dns.RcodeSuccess || len(r.Answer) != 3 {
		t.Fatalf("allowed.test: got rcode %s, %d answers, want NOERROR and 3", dns.RcodeToString[r.Rcode], len(r.Answer))
	}
	for _, rr := range r.Answer {
		if rr.Header().Ttl > 3600 {
			t.Errorf("answer TTL %d, want at most 3600 (MaxTTL)", rr.Header().Ttl)
		}
	}
	got := pol.take()
	want := []netip.Addr{netip.MustParseAddr("198.51.100.7"), netip.MustParseAddr("198.51.100.8")}
	if len(got) != 1 || fmt.Sprint(got[0].addrs) != fmt.Sprint(want) || got[0].name != "Allowed.Test." {
		t.Fatalf("AddResolved calls: got %+v, want one for allowed.test with %v", got, want)
	}
	if got[0].timeout != 30*time.Second { // the smallest TTL (5s), raised to MinTTL
		t.Errorf("timeout: got %v, want 30s", got[0].timeout)
	}
	// An allowed name answering a private address (DNS rebinding): the
	// sandbox is not told of it, only of the public one.
	r = query(t, p, "", "rebind.test", dns.TypeA)
	var answered []string
	for _, rr := range r.Answer {
		if a, ok := rr.(*dns.A); ok {
			answered = append(answered, a.A.String())
		}
	}
	if r.Rcode != dns.RcodeSuccess || fmt.Sprint(answered) != "[198.51.100.9]" {
		t.Errorf("rebind.test: got %s with A records %v, want NOERROR with [198.51.100.9] only", dns.RcodeToString[r.Rcode], answered)
	}
	pol.take()
	// A wildcard.
	if r := query(t, p, "", "a.b.wild.test", dns.TypeA); r.Rcode != dns.RcodeSuccess || len(r.Answer) == 0 {
		t.Errorf("a.b.wild.test: got %s, want an answer", dns.RcodeToString[r.Rcode])
	}
	pol.take()

	// Not on the list, denied (deny beats the wildcard), the wildcard's
	// apex: NXDOMAIN, and the upstream is not even asked.
	before := up.queries.Load()
	for _, n := range []string{"denied.test", "bad.wild.test", "wild.test", "allowed.test.evil.com", "xallowed.test", `x\.bad.wild.test`} {
		if r := query(t, p, "", n, dns.TypeA); r.Rcode != dns.RcodeNameError || len(r.Answer) != 0 {
			t.Errorf("%s: got %s with %d answers, want NXDOMAIN", n, dns.RcodeToString[r.Rcode], len(r.Answer))
		}
	}
	if n := up.queries.Load() - before; n != 0 {
		t.Errorf("the upstream got %d queries for names not allowed, want 0", n)
	}
	if a := pol.take(); len(a) != 0 {
		t.Errorf("names not allowed added addresses: %+v", a)
	}
	// An allowed name that is an alias (two hops, out of order) of a
	// denied one: NXDOMAIN, nothing allowed (deny wins on the chain).
	if r := query(t, p, "", "hop.wild.test", dns.TypeA); r.Rcode != dns.RcodeNameError || len(r.Answer) != 0 {
		t.Errorf("hop.wild.test (an alias of bad.wild.test): got %s with %d answers, want NXDOMAIN", dns.RcodeToString[r.Rcode], len(r.Answer))
	}
	if a := pol.take(); len(a) != 0 {
		t.Errorf("an alias of a denied name added addresses: %+v", a)
	}
	// An A record of a name that is not on the chain is dropped.
	r = query(t, p, "", "stray.wild.test", dns.TypeA)
	answered = nil
	for _, rr := range r.Answer {
		if a, ok := rr.(*dns.A); ok {
			answered = append(answered, a.A.String())
		}
	}
	if r.Rcode != dns.RcodeSuccess || fmt.Sprint(answered) != "[198.51.100.12]" {
		t.Errorf("stray.wild.test: got %s with A records %v, want NOERROR with [198.51.100.12] only", dns.RcodeToString[r.Rcode], answered)
	}
	if a := pol.take(); len(a) != 1 || fmt.Sprint(a[0].addrs) != "[198.51.100.12]" {
		t.Errorf("stray.wild.test added %+v, want [198.51.100.12] only", a)
	}
	// AAAA of an allowed name: empty (sandboxes are IPv4 only).
	if r := query(t, p, "", "allowed.test", dns.TypeAAAA); r.Rcode != dns.RcodeSuccess || len(r.Answer) != 0 {
		t.Errorf("AAAA allowed.test: got %s with %d answers, want NOERROR, none", dns.RcodeToString[r.Rcode], len(r.Answer))
	}
	// A source that is no sandbox with names: REFUSED.
	if r := query(t, p, "127.0.0.2", "allowed.test", dns.TypeA); r.Rcode != dns.RcodeRefused {
		t.Errorf("from 127.0.0.2: got %s, want REFUSED", dns.RcodeToString[r.Rcode])
	}
	// An upstream that does not answer: SERVFAIL once the upstream
	// timeout is over (a proxy with a short one; the upstream never
	// answers slow.test, so it always runs out).
	short := startProxy(t, pol, up.addr, func(c *Config) { c.Timeout = 300 * time.Millisecond })
	if r := query(t, short, "", "slow.test", dns.TypeA); r.Rcode != dns.RcodeServerFailure {
		t.Errorf("slow.test: got %s, want SERVFAIL", dns.RcodeToString[r.Rcode])
	}
	// A full set: SERVFAIL, not an answer the sandbox could not use.
	pol.mu.Lock()
	pol.err = fmt.Errorf("full: %w", errdefs.ErrResourceExhausted)
	pol.mu.Unlock()
	if r := query(t, p, "", "allowed.test", dns.TypeA); r.Rcode != dns.RcodeServerFailure || len(r.Answer) != 0 {
		t.Errorf("set full: got %s with %d answers, want SERVFAIL", dns.RcodeToString[r.Rcode], len(r.Answer))
	}
	// The policy changed between question and answer: NXDOMAIN.
	pol.mu.Lock()
	pol.err = fmt.Errorf("changed: %w", errdefs.ErrFailedPrecondition)
	pol.mu.Unlock()
	if r := query(t, p, "", "allowed.test", dns.TypeA); r.Rcode != dns.RcodeNameError || len(r.Answer) != 0 {
		t.Errorf("policy changed: got %s with %d answers, want NXDOMAIN", dns.RcodeToString[r.Rcode], len(r.Answer))
	}
}

// TestProxyAbuse: malformed, oversized and too many queries.
func TestProxyAbuse(t *testing.T) {
	up := startUpstream(t)
	pol := &fakePolicies{}
	p := startProxy(t, pol, up.addr, nil)

	// Two questions in one query: FORMERR.
	m := new(dns.Msg)
	m.SetQuestion("allowed.test.", dns.TypeA)
	m.Question = append(m.Question, dns.Question{Name: "other.test.", Qtype: dns.TypeA, Qclass: dns.ClassINET})
	c := &dns.Client{Net: "udp", Timeout: 30 * time.Second}
	if r, _, err := c.Exchange(m, p.Addr().String()); err != nil || r.Rcode != dns.RcodeFormatError {
		t.Errorf("two questions: got %v, %v; want FORMERR", r, err)
	}
	// A query over 512 bytes over TCP (UDP cuts it at the buffer): FORMERR.
	big := new(dns.Msg)
	big.SetQuestion("allowed.test.", dns.TypeA)
	big.Extra = append(big.Extra, &dns.TXT{Hdr: dns.RR_Header{Name: ".", Rrtype: dns.TypeTXT, Class: dns.ClassINET},
		Txt: []string{strings.Repeat("x", 250), strings.Repeat("y", 250), strings.Repeat("z", 250)}})
	tc := &dns.Client{Net: "tcp", Timeout: 30 * time.Second}
	if r, _, err := tc.Exchange(big, p.Addr().String()); err != nil || r.Rcode != dns.RcodeFormatError {
		t.Errorf("a %d-byte query over TCP: got %v, %v; want FORMERR", big.Len(), r, err)
	}
	// Over UDP it does not fit the buffer: what was read does not parse.
	uc := &dns.Client{Net: "udp", Timeout: 30 * time.Second}
	if r, _, err := uc.Exchange(big, p.Addr().String()); err != nil || r.Rcode != dns.RcodeFormatError {
		t.Errorf("a %d-byte query over UDP: got %v, %v; want FORMERR", big.Len(), r, err)
	}
	// The rate: after the burst, REFUSED. The limiter refills one token in
	// about 30 years: the count does not depend on how fast queries go.
	limited := startProxy(t, pol, up.addr, func(c *Config) { c.Rate, c.Burst = 1e-9, 5 })
	var got []string
	for range 20 {
		got = append(got, dns.RcodeToString[query(t, limited, "", "allowed.test", dns.TypeA).Rcode])
	}
	want := strings.Repeat("NOERROR ", 5) + strings.TrimSpace(strings.Repeat("REFUSED ", 15))
	if strings.Join(got, " ") != want {
		t.Errorf("20 queries with a burst of 5: got %v, want 5 NOERROR then 15 REFUSED", got)
	}
}

func TestStartBadConfig(t *testing.T) {
	for _, cfg := range []Config{
		{Listen: netip.MustParseAddrPort("127.0.0.1:0"), Policies: &fakePolicies{}, MatchName: network.MatchName},
		{Listen: netip.MustParseAddrPort("127.0.0.1:0"), Policies: &fakePolicies{}, MatchName: network.MatchName, Upstream: "nohostport"},
	} {
		if _, err := Start(context.Background(), cfg); !errdefs.IsInvalidArgument(err) {
			t.Errorf("Start(%+v): %v, want InvalidArgument", cfg, err)
		}
	}
}

// TestProxyDeviceAndClients: the sockets are bound to the device (a device
// that does not exist fails the start); sources outside Clients are
// refused and get no rate limiter (a flood of them cannot clear the
// sandboxes' limiters).
func TestProxyDeviceAndClients(t *testing.T) {
	up := startUpstream(t)
	pol := &fakePolicies{}
	cfg := Config{Listen: netip.MustParseAddrPort("127.0.0.1:0"), Device: "fbx-no-such-dev", Upstream: up.addr, Policies: pol, MatchName: network.MatchName}
	if p, err := Start(context.Background(), cfg); !errdefs.IsUnavailable(err) {
		if err == nil {
			p.Close()
		}
		t.Fatalf("Start on a device that does not exist: %v, want Unavailable", err)
	}
	p := startProxy(t, pol, up.addr, func(c *Config) {
		c.Device, c.Clients = "lo", netip.MustParsePrefix("127.0.0.1/32")
	})
	if r := query(t, p, "", "allowed.test", dns.TypeA); r.Rcode != dns.RcodeSuccess {
		t.Errorf("bound to lo, from a client: got %s, want NOERROR", dns.RcodeToString[r.Rcode])
	}
	for _, from := range []string{"127.0.0.2", "127.0.0.3"} {
		if r := query(t, p, from, "allowed.test", dns.TypeA); r.Rcode != dns.RcodeRefused {
			t.Errorf("from %s, outside Clients: got %s, want REFUSED", from, dns.RcodeToString[r.Rcode])
		}
	}
	p.mu.Lock()
	n := len(p.limiters)
	p.mu.Unlock()
	if n != 1 {
		t.Errorf("%d rate limiters, want 1 (the client's only)", n)
	}
}

// One sandbox whose allowed zone never answers holds its share of the
// upstream queries, and more only while a quarter of them stay free: not
// all of them, and another sandbox is still answered.
func TestProxyFairShare(t *testing.T) {
	up := startUpstream(t)
	p := startProxy(t, &fakePolicies{}, up.addr, func(c *Config) { c.Inflight, c.InflightPerSource = 4, 2 })

	// Source A (127.0.0.1) sends as many slow queries as there are slots.
	c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(p.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var replies atomic.Int64
	var servfails atomic.Int64
	go func() {
		buf := make([]byte, 512)
		for {
			n, err := c.Read(buf)
			if err != nil {
				return
			}
			m := new(dns.Msg)
			if m.Unpack(buf[:n]) == nil && m.Rcode == dns.RcodeServerFailure {
				servfails.Add(1)
			}
			replies.Add(1)
		}
	}()
	for i := range 4 {
		m := new(dns.Msg)
		m.SetQuestion("slow.test.", dns.TypeA)
		m.Id = uint16(i + 1)
		b, _ := m.Pack()
		if _, err := c.Write(b); err != nil {
			t.Fatal(err)
		}
	}
	// Each of A's queries is either answered at once or held upstream
	// (the upstream never answers slow.test; the proxy's timeout is 30 s).
	deadline := time.Now().Add(time.Minute)
	for replies.Load()+up.slow.Load() < 4 {
		if time.Now().After(deadline) {
			t.Fatalf("A's queries: %d answered, %d upstream after a minute, want 4 in all", replies.Load(), up.slow.Load())
		}
		time.Sleep(10 * time.Millisecond) // polls the counters, bounded above
	}
	// Its share (2), and one more while more than a quarter of the slots
	// (1 of 4) were free; the last one is kept for the others.
	if held, refused := up.slow.Load(), servfails.Load(); held != 3 || refused != 1 {
		t.Errorf("A holds %d upstream queries and got %d SERVFAIL, want 3 and 1", held, refused)
	}
	// B (127.0.0.3) is answered.
	if r := query(t, p, "127.0.0.3", "allowed.test", dns.TypeA); r.Rcode != dns.RcodeSuccess || len(r.Answer) == 0 {
		t.Errorf("B while A holds its share: got %s with %d answers, want an answer", dns.RcodeToString[r.Rcode], len(r.Answer))
	}
}

// One sandbox holds its maxTCPConnsPerSource TCP connections, and more
// only while a quarter stay free: its next one is closed at once, and
// another sandbox's query over TCP is answered.
func TestProxyTCPShare(t *testing.T) {
	up := startUpstream(t)
	p := startProxy(t, &fakePolicies{}, up.addr, func(c *Config) { c.TCPTimeout = time.Minute })
	addr := net.TCPAddrFromAddrPort(p.Addr())
	dial := func(from string) *net.TCPConn {
		t.Helper()
		c, err := net.DialTCP("tcp", &net.TCPAddr{IP: net.ParseIP(from)}, addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	// A opens as many connections as the proxy takes in all, and leaves
	// them idle (the proxy's TCP timeout is a minute here): it keeps its
	// share and more while a quarter (16) stay free, 48 in all; every
	// other one is closed without a byte.
	const kept = maxTCPConns - maxTCPConns/4
	var conns []*net.TCPConn
	for range maxTCPConns {
		conns = append(conns, dial("127.0.0.1"))
	}
	closed := 0
	deadline := time.Now().Add(30 * time.Second) // against a hang
	for _, c := range conns[kept:] {
		c.SetReadDeadline(deadline)
		if _, err := c.Read(make([]byte, 1)); err == io.EOF {
			closed++
		}
	}
	if want := maxTCPConns - kept; closed != want {
		t.Errorf("A's connections past its share: %d closed, want %d", closed, want)
	}
	// B is served over TCP.
	tc := &dns.Client{Net: "tcp", Timeout: 30 * time.Second, Dialer: &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.3")}, Timeout: 30 * time.Second}}
	m := new(dns.Msg)
	m.SetQuestion("allowed.test.", dns.TypeA)
	if r, _, err := tc.Exchange(m, p.Addr().String()); err != nil || r.Rcode != dns.RcodeSuccess || len(r.Answer) == 0 {
		t.Errorf("B over TCP while A holds its share: %v, %v; want an answer", r, err)
	}
}
