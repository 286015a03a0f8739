package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/vishvananda/netns"

	"github.com/forkbox/forkbox/client"
)

// fakeWorld is "the outside world" of the egress tests: a network
// namespace on this host, reached from the host by a veth pair, with
// addresses in 10.250.<third>.0/24 and two in the documentation ranges
// (routed from the host through the veth), a TCP listener on port 80 of
// every one of them, and a DNS server at .53.
type fakeWorld struct {
	prefix  string // "10.250.<third>."
	dnsAddr string // ip:port of the DNS server
}

// addr is the fake world's address last: 10.250.<third>.<last>, but for
// the names' answers, which must be public addresses for the DNS proxy to
// pass them on (it drops private ones): allowed.test is 198.51.100.<third>
// (TEST-NET-2), denied.test 203.0.113.<third> (TEST-NET-3). Both are routed
// nowhere but to this run's namespace.
func (w fakeWorld) addr(last int) string {
	switch last {
	case worldAllowed:
		return fmt.Sprintf("198.51.100.%d", third)
	case worldDenied:
		return fmt.Sprintf("203.0.113.%d", third)
	}
	return fmt.Sprintf("%s%d", w.prefix, last)
}

// The fake world's addresses: allowed.test, denied.test; .29 and .30 are
// in the allowed CIDR .28/30, .30 is also denied; private.test answers .40,
// a private address (DNS rebinding).
const (
	worldAllowed  = 10
	worldDenied   = 20
	worldCIDR     = 29
	worldCIDRDeny = 30
	worldPrivate  = 40
	worldDNS      = 53
)

func ipCmd(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// startFakeWorld makes the namespace and its servers; t's cleanup removes
// them.
func startFakeWorld(t *testing.T) fakeWorld {
	t.Helper()
	w := fakeWorld{prefix: fmt.Sprintf("10.250.%d.", third)}
	w.dnsAddr = w.addr(worldDNS) + ":53"
	ns, hostVeth, hostIP, nsIP := "fbxw"+runID, "fbw"+runID, fmt.Sprintf("10.249.%d.1", third), fmt.Sprintf("10.249.%d.2", third)
	exec.Command("ip", "netns", "del", ns).Run() // left by a killed run
	ipCmd(t, "netns", "add", ns)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	ipCmd(t, "link", "add", hostVeth, "type", "veth", "peer", "name", "eth0", "netns", ns)
	t.Cleanup(func() { exec.Command("ip", "link", "del", hostVeth).Run() })
	ipCmd(t, "addr", "add", hostIP+"/30", "dev", hostVeth)
	ipCmd(t, "link", "set", hostVeth, "up")
	ipCmd(t, "-n", ns, "addr", "add", nsIP+"/30", "dev", "eth0")
	for _, last := range []int{worldAllowed, worldDenied, worldCIDR, worldCIDRDeny, worldPrivate, worldDNS} {
		ipCmd(t, "-n", ns, "addr", "add", w.addr(last)+"/32", "dev", "eth0")
	}
	ipCmd(t, "-n", ns, "link", "set", "eth0", "up")
	ipCmd(t, "-n", ns, "link", "set", "lo", "up")
	ipCmd(t, "route", "add", w.prefix+"0/24", "via", nsIP)
	t.Cleanup(func() { exec.Command("ip", "route", "del", w.prefix+"0/24").Run() })
	for _, last := range []int{worldAllowed, worldDenied} {
		dst := w.addr(last) + "/32"
		exec.Command("ip", "route", "del", dst).Run() // left by a killed run
		ipCmd(t, "route", "add", dst, "via", nsIP)
		t.Cleanup(func() { exec.Command("ip", "route", "del", dst).Run() })
	}

	// Sockets made while this thread is in the namespace stay in it.
	var tcp net.Listener
	var udp net.PacketConn
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- err
			return
		}
		defer orig.Close()
		target, err := netns.GetFromName(ns)
		if err == nil {
			defer target.Close()
			err = netns.Set(target)
		}
		if err == nil {
			tcp, err = net.Listen("tcp4", ":80")
		}
		if err == nil {
			udp, err = net.ListenPacket("udp4", w.dnsAddr)
		}
		// Back to the host's namespace before the thread serves others.
		// Left locked there, the thread would die with the goroutine,
		// unless it is the main thread, which Go cannot end: the process
		// would then stay in the fake world for good, and what it names
		// after its namespace (the host's forwarding record) go astray.
		if netns.Set(orig) == nil {
			runtime.UnlockOSThread()
		}
		errc <- err
	}()
	if err := <-errc; err != nil {
		t.Fatalf("listen in the fake world: %v", err)
	}
	t.Cleanup(func() { tcp.Close() })
	go func() {
		for {
			c, err := tcp.Accept()
			if err != nil {
				return
			}
			fmt.Fprintf(c, "hello from %s\n", c.LocalAddr())
			c.Close()
		}
	}()
	answers := map[string]string{"allowed.test.": w.addr(worldAllowed), "denied.test.": w.addr(worldDenied), "private.test.": w.addr(worldPrivate)}
	srv := &dns.Server{PacketConn: udp, Handler: dns.HandlerFunc(func(rw dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		q := r.Question[0]
		a, ok := answers[strings.ToLower(q.Name)]
		switch {
		case !ok:
			m.Rcode = dns.RcodeNameError
		case q.Qtype == dns.TypeA:
			m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 300}, A: net.ParseIP(a)})
		}
		rw.WriteMsg(m)
	})}
	started := make(chan struct{})
	srv.NotifyStartedFunc = func() { close(started) }
	done := make(chan struct{})
	go func() { defer close(done); srv.ActivateAndServe() }()
	<-started
	t.Cleanup(func() { srv.Shutdown(); <-done })

	// The host reaches it (so a refusal below is the policy's doing).
	c, err := net.DialTimeout("tcp", w.addr(worldAllowed)+":80", 5*time.Second)
	if err != nil {
		t.Fatalf("the host cannot reach the fake world: %v", err)
	}
	c.Close()
	return w
}

// probeLines runs the probe in sb and returns its lines by target:
// "ok ..." / "ALLOWED ..." or "denied ...".
func probeLines(t *testing.T, sb *client.Sandbox, mode string, targets ...string) map[string]string {
	t.Helper()
	out, errs, res := sh(t, sb, "/root/probe "+mode+" "+strings.Join(targets, " "))
	if res.ExitCode != 0 {
		t.Fatalf("probe %s: exit %d: %s", mode, res.ExitCode, errs)
	}
	got := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		name, rest, _ := strings.Cut(l, " ")
		got[strings.TrimPrefix(strings.TrimPrefix(name, "dial-"), "lookup-")] = rest
	}
	return got
}

// expectEgress checks what sb reaches: each target (a dial address, or a
// name to look up when lookups) passes or not as want says.
func expectEgress(t *testing.T, sb *client.Sandbox, what string, dials map[string]bool, lookups map[string]bool) {
	t.Helper()
	check := func(mode string, want map[string]bool) {
		if len(want) == 0 {
			return
		}
		var targets []string
		for k := range want {
			targets = append(targets, k)
		}
		slices.Sort(targets)
		got := probeLines(t, sb, mode, targets...)
		for _, k := range targets {
			line, ok := got[k]
			passed := strings.HasPrefix(line, "ok") || strings.HasPrefix(line, "ALLOWED")
			switch {
			case !ok:
				t.Errorf("%s: %s %s: no probe line in %v", what, mode, k, got)
			case passed != want[k]:
				// ip_forward is host-wide: another test on this host (one
				// that restores it when it ends) may have switched it off.
				fwd, _ := os.ReadFile("/proc/sys/net/ipv4/ip_forward")
				t.Errorf("%s: %s %s: %s; want passed=%v (host ip_forward now %q)", what, mode, k, line, want[k], strings.TrimSpace(string(fwd)))
			default:
				t.Logf("%s: %s %s: %s", what, mode, k, line)
			}
		}
	}
	check("lookup", lookups)
	check("dial", dials)
}

// TestEgressAllowlist: a sandbox with an allowlist of a name and a CIDR and
// a denylist reaches what they allow and nothing else (names through the
// daemon's DNS proxy, forwarded to a fake upstream), whatever else it
// aims at; a live change takes effect; a fork inherits the lists.
func TestEgressAllowlist(t *testing.T) {
	w := startFakeWorld(t)
	withDaemonFlags(t, "--dns-upstream", w.dnsAddr)
	hostLn, err := net.Listen("tcp", ":0") // every host address
	if err != nil {
		t.Fatal(err)
	}
	defer hostLn.Close()
	go func() {
		for {
			c, err := hostLn.Accept()
			if err != nil {
				return
			}
			t.Errorf("the host accepted a connection from %s", c.RemoteAddr())
			c.Close()
		}
	}()
	hostPort := hostLn.Addr().(*net.TCPAddr).Port
	port80 := func(last int) string { return w.addr(last) + ":80" }

	forEachRuntime(t, func(t *testing.T) {
		ctx := context.Background()
		victim := newSandbox(t, clientOpts())
		if _, err := victim.Start(ctx, client.ExecOptions{Shell: "while true; do nc -l -p 9000 </dev/null; done"}); err != nil {
			t.Fatal(err)
		}
		o := clientOpts()
		o.EgressAllow = []string{"allowed.test", "private.test", w.prefix + "28/30"}
		o.EgressDeny = []string{w.addr(worldCIDRDeny)}
		sb := newSandbox(t, o)
		if sb.Info.Egress != "allow" || !slices.Equal(sb.Info.EgressAllow, []string{w.prefix + "28/30", "allowed.test", "private.test"}) ||
			!slices.Equal(sb.Info.EgressDeny, []string{w.addr(worldCIDRDeny) + "/32"}) {
			t.Errorf("inspect: egress %q allow %v deny %v", sb.Info.Egress, sb.Info.EgressAllow, sb.Info.EgressDeny)
		}
		installProbe(t, sb)

		blocked := map[string]bool{
			port80(worldDenied):                      false, // resolved for nobody: by IP
			port80(worldCIDRDeny):                    false, // deny beats allow
			"169.254.169.254:80":                     false,
			"[fd00:ec2::254]:80":                     false,
			"[2001:db8::1]:80":                       false,
			net.JoinHostPort(victim.Info.Ip, "9000"): false,
		}
		for _, a := range hostAddrs(t, hostPort) {
			blocked[a] = false
		}
		dials := map[string]bool{"allowed.test:80": true, port80(worldCIDR): true}
		for k, v := range blocked {
			dials[k] = v
		}
		expectEgress(t, sb, "allowlist", dials, map[string]bool{"allowed.test": true, "denied.test": false})
		if line := probeLines(t, sb, "lookup", "allowed.test")["allowed.test"]; line != "ok "+w.addr(worldAllowed) {
			t.Errorf("allowed.test resolved to %q, want ok %s", line, w.addr(worldAllowed))
		}

		// DNS rebinding: private.test is allowed but answers a private
		// address; the sandbox is not told of it and cannot reach it...
		expectEgress(t, sb, "a private answer", map[string]bool{"private.test:80": false, port80(worldPrivate): false},
			map[string]bool{"private.test": false})
		// ... unless a CIDR on its list covers it.
		if err := sb.SetEgress(ctx, client.EgressOptions{Allow: append(slices.Clone(o.EgressAllow), w.addr(worldPrivate)), Deny: o.EgressDeny}); err != nil {
			t.Fatal(err)
		}
		expectEgress(t, sb, "a private answer, its CIDR allowed", map[string]bool{"private.test:80": true}, map[string]bool{"private.test": true})
		if line := probeLines(t, sb, "lookup", "private.test")["private.test"]; line != "ok "+w.addr(worldPrivate) {
			t.Errorf("private.test with its CIDR allowed resolved to %q, want ok %s", line, w.addr(worldPrivate))
		}

		// Live change: only denied.test now. The addresses allowed.test
		// resolved to no longer pass.
		if err := sb.SetEgress(ctx, client.EgressOptions{Allow: []string{"denied.test"}}); err != nil {
			t.Fatal(err)
		}
		expectEgress(t, sb, "after SetEgress", map[string]bool{
			"denied.test:80": true, port80(worldAllowed): false, port80(worldCIDR): false, "169.254.169.254:80": false,
		}, map[string]bool{"allowed.test": false})
		if evs, err := env.c.Events(ctx, sb.ID); err != nil || !slices.ContainsFunc(evs, func(e client.Event) bool { return e.Type == "sandbox.egress_changed" }) {
			t.Errorf("no sandbox.egress_changed in the ledger (%v)", err)
		}
		// Bad lists are refused and change nothing.
		if err := sb.SetEgress(ctx, client.EgressOptions{Allow: []string{"10.0.0.0/33"}}); err == nil {
			t.Errorf("SetEgress with a bad CIDR: accepted")
		}
		if err := sb.SetEgress(ctx, client.EgressOptions{Egress: "none"}); err != nil {
			t.Fatal(err)
		}
		expectEgress(t, sb, "egress none", map[string]bool{"denied.test:80": false, port80(worldCIDR): false}, nil)
		if err := sb.SetEgress(ctx, client.EgressOptions{Allow: o.EgressAllow, Deny: o.EgressDeny}); err != nil {
			t.Fatal(err)
		}

		// A fork inherits the lists.
		kid, err := sb.ForkOne(ctx, "egress")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { kid.Close(context.Background()) })
		if !slices.Equal(kid.Info.EgressAllow, sb.Info.EgressAllow) || !slices.Equal(kid.Info.EgressDeny, sb.Info.EgressDeny) {
			t.Errorf("the fork's lists: allow %v deny %v, want the parent's %v %v", kid.Info.EgressAllow, kid.Info.EgressDeny, sb.Info.EgressAllow, sb.Info.EgressDeny)
		}
		expectEgress(t, kid, "fork", map[string]bool{
			"allowed.test:80": true, port80(worldCIDR): true, port80(worldDenied): false, port80(worldCIDRDeny): false,
		}, map[string]bool{"denied.test": false})

		// A DNS flood from the fork: past its rate the proxy refuses, a
		// query too big for its buffer is not answered (FORMERR), and the parent
		// (another sandbox, its own rate) still resolves at once.
		out := mustSh(t, kid, fmt.Sprintf("/root/probe dnsflood %s:53 300 allowed.test", gateway))
		var sent, noerror, refused, other, silent, spanMS int
		if _, err := fmt.Sscanf(out, "dnsflood sent %d noerror %d refused %d other %d silent %d span_ms %d", &sent, &noerror, &refused, &other, &silent, &spanMS); err != nil {
			t.Fatalf("dnsflood: %q: %v", out, err)
		}
		t.Logf("dnsflood: %s", strings.TrimSpace(out))
		// The proxy answers a burst of 50, then 20 a second: over the
		// flood's span (however long a loaded host made it) at most that
		// many, and the rest refused.
		allowed := 50 + 20*(spanMS+999)/1000
		if noerror > allowed || (sent-1 > allowed && refused == 0) || other+silent == 0 {
			t.Errorf("dnsflood: %s; want at most %d answered (burst 50, 20/s over %d ms), the rest refused, the big one not (FORMERR or nothing)", strings.TrimSpace(out), allowed, spanMS)
		}
		expectEgress(t, sb, "during the fork's flood", map[string]bool{"allowed.test:80": true}, map[string]bool{"allowed.test": true})

		// A restarted daemon (SIGKILL: nothing closed cleanly) applies the
		// recorded lists again: the DNS proxy knows them from reconcile.
		restartDaemon(t, syscall.SIGKILL)
		expectEgress(t, kid, "after a restart", map[string]bool{
			"allowed.test:80": true, port80(worldDenied): false, port80(worldCIDRDeny): false,
		}, map[string]bool{"denied.test": false})

		// A hibernated sandbox gives its bridge port back and keeps its
		// lists: woken (by the probe's exec) into a new port, the same
		// apply.
		if curRuntime == "gvisor" {
			if err := kid.Hibernate(ctx); err != nil {
				t.Fatal(err)
			}
			expectEgress(t, kid, "after hibernation", map[string]bool{
				"allowed.test:80": true, port80(worldCIDR): true, port80(worldDenied): false, port80(worldCIDRDeny): false,
				"169.254.169.254:80": false, net.JoinHostPort(victim.Info.Ip, "9000"): false,
			}, map[string]bool{"allowed.test": true, "denied.test": false})
		}
	})
	// Closed sandboxes leave no egress chain, set or element behind.
	audit(t)
}

// TestEgressCLI: the lists through the forkbox binary, as the README shows
// them: create with lists, inspect, change, refuse bad input.
func TestEgressCLI(t *testing.T) {
	fb := func(args ...string) (string, string, int) { return cli(t, args...) }
	info := func(out string) v1Sandbox {
		t.Helper()
		var s v1Sandbox
		if err := json.Unmarshal([]byte(out), &s); err != nil {
			t.Fatalf("decode %q: %v", out, err)
		}
		return s
	}
	out, errs, code := fb("create", "--json", "--image", env.image, "--runtime", "crun", "--name", "egress-cli",
		"--egress-allow", "api.example.com,*.example.org,10.1.0.0/16", "--egress-deny", "10.1.2.0/24")
	if code != 0 {
		t.Fatalf("create: exit %d: %s", code, errs)
	}
	t.Cleanup(func() { fb("rm", "egress-cli") })
	if s := info(out); s.Egress != "allow" || !slices.Equal(s.EgressAllow, []string{"10.1.0.0/16", "*.example.org", "api.example.com"}) ||
		!slices.Equal(s.EgressDeny, []string{"10.1.2.0/24"}) {
		t.Errorf("create: %+v", s)
	}
	if _, errs, code := fb("egress", "egress-cli", "all", "--deny", "192.0.2.0/24"); code != 0 {
		t.Fatalf("egress all --deny: exit %d: %s", code, errs)
	}
	out, _, _ = fb("inspect", "egress-cli")
	if s := info(out); s.Egress != "all" || len(s.EgressAllow) != 0 || !slices.Equal(s.EgressDeny, []string{"192.0.2.0/24"}) {
		t.Errorf("inspect after egress all --deny: %+v", s)
	}
	for _, bad := range [][]string{
		{"egress", "egress-cli", "--allow", "10.0.0.0/33"},
		{"egress", "egress-cli", "--allow", "exa_mple.com"},
		{"egress", "egress-cli", "none", "--deny", "10.0.0.0/8"},
		{"egress", "egress-cli", "--allow", "169.254.169.254"},
	} {
		if _, errs, code := fb(bad...); code == 0 || !strings.Contains(errs, "InvalidArgument") {
			t.Errorf("%v: exit %d, stderr %q; want an InvalidArgument error", bad, code, errs)
		}
	}
	if _, errs, code := fb("egress", "egress-cli", "none"); code != 0 {
		t.Fatalf("egress none: exit %d: %s", code, errs)
	}
	out, _, _ = fb("inspect", "egress-cli")
	if s := info(out); s.Egress != "none" || len(s.EgressAllow)+len(s.EgressDeny) != 0 {
		t.Errorf("inspect after egress none: %+v", s)
	}
}

// v1Sandbox is the part of `forkbox inspect --json` the egress tests read.
type v1Sandbox struct {
	Egress      string   `json:"egress"`
	EgressAllow []string `json:"egress_allow"`
	EgressDeny  []string `json:"egress_deny"`
}
