package network

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/forkbox/forkbox/errdefs"
)

// EgressAllow lets the sandbox open connections only to the addresses of
// its allow list: CIDRs, and the addresses the DNS proxy resolved for the
// names on it (see Policy).
const EgressAllow Egress = "allow"

// Bounds on a policy's lists: every entry comes from an API caller.
const (
	MaxListEntries = 64  // per list (allow, deny)
	maxNameLen     = 253 // a DNS name, without the trailing dot
)

// Policy is a sandbox's egress policy.
//
//   - Mode "none": nothing leaves the sandbox; the lists must be empty.
//   - Mode "all": the outside world, minus Deny (CIDRs only: with "all" the
//     sandbox may use any resolver, so a denied name could not be enforced).
//   - Mode "allow": only Allow (CIDRs, and the resolved addresses of
//     AllowNames), minus Deny. Deny wins over allow, for CIDRs and names.
//
// Whatever the lists say, link-local addresses (169.254.0.0/16, where cloud
// metadata lives, and all of IPv6: sandbox networks are IPv4 only, so
// fe80::/10 and fd00:ec2::254 are never reachable), other sandboxes and
// the host itself stay unreachable.
//
// Names are exact ("api.example.com") or wildcards ("*.example.com": any
// name below example.com, not example.com itself).
type Policy struct {
	Mode       Egress
	Allow      []netip.Prefix
	AllowNames []string
	Deny       []netip.Prefix
	DenyNames  []string
}

// ParsePolicy checks mode and the allow and deny lists (each entry a CIDR,
// an IPv4 address, a DNS name or a "*." wildcard) and returns the policy.
// Mode "" means "allow" when allow is given, else "none". A bad entry, too
// many entries or lists that do not fit the mode fail with InvalidArgument.
func ParsePolicy(mode string, allow, deny []string) (Policy, error) {
	p := Policy{Mode: Egress(mode)}
	var err error
	if p.Allow, p.AllowNames, err = parseList("allow", allow, true); err != nil {
		return Policy{}, err
	}
	if p.Deny, p.DenyNames, err = parseList("deny", deny, false); err != nil {
		return Policy{}, err
	}
	hasAllow := len(p.Allow)+len(p.AllowNames) > 0
	hasDeny := len(p.Deny)+len(p.DenyNames) > 0
	switch p.Mode {
	case "":
		p.Mode = EgressNone
		if hasAllow {
			p.Mode = EgressAllow
		}
	case EgressNone, EgressAll, EgressAllow:
	default:
		return Policy{}, fmt.Errorf("egress %q: want none, all or allow: %w", mode, errdefs.ErrInvalidArgument)
	}
	switch {
	case p.Mode == EgressNone && (hasAllow || hasDeny):
		return Policy{}, fmt.Errorf("egress none takes no allow or deny list: %w", errdefs.ErrInvalidArgument)
	case p.Mode == EgressAll && hasAllow:
		return Policy{}, fmt.Errorf("egress all takes no allow list (give the list alone for an allowlist): %w", errdefs.ErrInvalidArgument)
	case p.Mode == EgressAll && len(p.DenyNames) > 0:
		return Policy{}, fmt.Errorf("egress all cannot deny names (the sandbox may use any resolver): deny their addresses, or use an allow list: %w", errdefs.ErrInvalidArgument)
	case p.Mode == EgressAllow && !hasAllow:
		return Policy{}, fmt.Errorf("egress allow needs an allow list: %w", errdefs.ErrInvalidArgument)
	}
	return p, nil
}

// Lists returns the policy's allow and deny lists as canonical strings
// (CIDRs, then names; sorted), the form ParsePolicy reads back.
func (p Policy) Lists() (allow, deny []string) {
	return listStrings(p.Allow, p.AllowNames), listStrings(p.Deny, p.DenyNames)
}

// HasNames reports whether the sandbox resolves names through the proxy.
func (p Policy) HasNames() bool { return p.Mode == EgressAllow && len(p.AllowNames) > 0 }

// WithoutNames is the policy without its names: its CIDRs, or egress
// "none" when an allow list had names only.
func (p Policy) WithoutNames() Policy {
	p.AllowNames, p.DenyNames = nil, nil
	if p.Mode == EgressAllow && len(p.Allow) == 0 {
		return Policy{Mode: EgressNone}
	}
	return p
}

// chained reports whether the policy needs the sandbox's own chain.
func (p Policy) chained() bool {
	return p.Mode == EgressAllow || p.Mode == EgressAll && len(p.Deny) > 0
}

func listStrings(cidrs []netip.Prefix, names []string) []string {
	if len(cidrs)+len(names) == 0 {
		return nil
	}
	out := make([]string, 0, len(cidrs)+len(names))
	for _, c := range cidrs {
		out = append(out, c.String())
	}
	return append(out, names...)
}

var linkLocal4 = netip.MustParsePrefix("169.254.0.0/16")

// unreachable are IPv4 ranges an allow entry cannot open: it would be no
// use, as they are dropped before the lists are looked at (link-local) or
// never leave the sandbox (loopback, "this network").
var unreachable = []netip.Prefix{linkLocal4, netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("0.0.0.0/8")}

// nonPublic are the IPv4 ranges a DNS answer may not open for a sandbox
// unless a CIDR on its allow list covers them: an allowed name (or a CNAME
// under it) answering 10.0.0.5 would otherwise let the sandbox into the
// host's own network, masqueraded (DNS rebinding). They are:
//
//	0.0.0.0/8        "this network"
//	10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16   private (RFC 1918)
//	100.64.0.0/10    shared address space, carrier-grade NAT (RFC 6598)
//	127.0.0.0/8      loopback
//	169.254.0.0/16   link-local (cloud metadata)
//	192.0.0.0/24     IETF protocol assignments (RFC 6890)
//	192.88.99.0/24   6to4 relay anycast (RFC 7526)
//	198.18.0.0/15    benchmarking (RFC 2544)
//	224.0.0.0/4      multicast
//	240.0.0.0/4      reserved, and the broadcast address 255.255.255.255
//
// The documentation ranges (192.0.2.0/24, 198.51.100.0/24, 203.0.113.0/24)
// are routed nowhere on the internet and are not on the list.
var nonPublic = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("10.0.0.0/8"),
	netip.MustParsePrefix("100.64.0.0/10"),
	netip.MustParsePrefix("127.0.0.0/8"),
	linkLocal4,
	netip.MustParsePrefix("172.16.0.0/12"),
	netip.MustParsePrefix("192.0.0.0/24"),
	netip.MustParsePrefix("192.88.99.0/24"),
	netip.MustParsePrefix("192.168.0.0/16"),
	netip.MustParsePrefix("198.18.0.0/15"),
	netip.MustParsePrefix("224.0.0.0/4"),
	netip.MustParsePrefix("240.0.0.0/4"),
}

// PublicAddr reports whether a is an IPv4 address a DNS answer may open
// for a sandbox without a CIDR on its allow list (see nonPublic).
func PublicAddr(a netip.Addr) bool {
	a = a.Unmap()
	if !a.Is4() || a.IsPrivate() || a.IsLoopback() || a.IsLinkLocalUnicast() || a.IsMulticast() || a.IsUnspecified() {
		return false
	}
	for _, p := range nonPublic {
		if p.Contains(a) {
			return false
		}
	}
	return true
}

// parseList splits a list into CIDRs and names, canonical, sorted and
// without duplicates.
func parseList(which string, list []string, allow bool) ([]netip.Prefix, []string, error) {
	if len(list) > MaxListEntries {
		return nil, nil, fmt.Errorf("egress %s list has %d entries, more than %d: %w", which, len(list), MaxListEntries, errdefs.ErrInvalidArgument)
	}
	var cidrs []netip.Prefix
	var names []string
	for _, raw := range list {
		e := strings.TrimSpace(raw)
		if e == "" || len(e) > maxNameLen+1 {
			return nil, nil, fmt.Errorf("egress %s list: an entry of %d bytes (want 1 to %d): %w", which, len(e), maxNameLen+1, errdefs.ErrInvalidArgument)
		}
		if c, ok, err := parseCIDR(e); ok {
			if err != nil {
				return nil, nil, fmt.Errorf("egress %s list: %q: %v: %w", which, e, err, errdefs.ErrInvalidArgument)
			}
			if allow {
				if !c.Addr().Is4() {
					return nil, nil, fmt.Errorf("egress allow list: %q: sandbox networks are IPv4 only: %w", e, errdefs.ErrInvalidArgument)
				}
				for _, u := range unreachable {
					if u.Bits() <= c.Bits() && u.Contains(c.Addr()) {
						return nil, nil, fmt.Errorf("egress allow list: %q is in %s, which a sandbox can never reach: %w", e, u, errdefs.ErrInvalidArgument)
					}
				}
			}
			cidrs = append(cidrs, c)
			continue
		}
		n, err := canonicalName(e)
		if err != nil {
			return nil, nil, fmt.Errorf("egress %s list: %w", which, err)
		}
		names = append(names, n)
	}
	slices.SortFunc(cidrs, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return a.Bits() - b.Bits()
	})
	slices.Sort(names)
	return slices.Compact(cidrs), slices.Compact(names), nil
}

// parseCIDR reads an address or a CIDR. ok is false when e is neither
// (then it may be a name); err is set for a CIDR that is not canonical.
func parseCIDR(e string) (netip.Prefix, bool, error) {
	if a, err := netip.ParseAddr(e); err == nil {
		if a.Zone() != "" {
			return netip.Prefix{}, true, fmt.Errorf("an address with a zone")
		}
		a = a.Unmap()
		return netip.PrefixFrom(a, a.BitLen()), true, nil
	}
	if !strings.Contains(e, "/") {
		return netip.Prefix{}, false, nil
	}
	p, err := netip.ParsePrefix(e)
	if err != nil {
		return netip.Prefix{}, true, fmt.Errorf("not a CIDR")
	}
	if p.Masked() != p {
		return netip.Prefix{}, true, fmt.Errorf("host bits set (did you mean %s?)", p.Masked())
	}
	return p, true, nil
}

// canonicalName checks a DNS name or "*." wildcard and returns it lower
// case without a trailing dot.
func canonicalName(e string) (string, error) {
	n := strings.ToLower(strings.TrimSuffix(e, "."))
	bad := func(why string) (string, error) {
		shown := e
		if len(shown) > 80 {
			shown = shown[:80] + "..."
		}
		return "", fmt.Errorf("%q is not a CIDR, address or DNS name: %s: %w", shown, why, errdefs.ErrInvalidArgument)
	}
	if len(n) == 0 || len(n) > maxNameLen {
		return bad(fmt.Sprintf("a name has 1 to %d bytes", maxNameLen))
	}
	labels := strings.Split(n, ".")
	if labels[0] == "*" {
		if len(labels) < 3 {
			return bad("a wildcard needs at least two labels after \"*.\"")
		}
		labels = labels[1:]
	}
	for _, l := range labels {
		if len(l) == 0 || len(l) > 63 {
			return bad("a label has 1 to 63 bytes")
		}
		if l[0] == '-' || l[len(l)-1] == '-' {
			return bad("a label cannot start or end with '-'")
		}
		for i := 0; i < len(l); i++ {
			c := l[i]
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
				return bad(fmt.Sprintf("character %q", c))
			}
		}
	}
	if tld := labels[len(labels)-1]; strings.Trim(tld, "0123456789") == "" {
		return bad("the last label is all digits")
	}
	return n, nil
}

// MatchName reports whether the DNS name q (any case, trailing dot or not)
// is matched by an entry of names (canonical, as in a Policy). q is a
// name as miekg/dns prints it: a name with an escape ("x\.corp.example.com",
// whose first label is "x.corp") never matches, so that a wildcard is
// matched on labels, not on the printed text (host names have none).
func MatchName(names []string, q string) bool {
	if strings.ContainsRune(q, '\\') {
		return false
	}
	q = strings.ToLower(strings.TrimSuffix(q, "."))
	for _, n := range names {
		if suffix, ok := strings.CutPrefix(n, "*."); ok {
			if strings.HasSuffix(q, "."+suffix) {
				return true
			}
		} else if q == n {
			return true
		}
	}
	return false
}
