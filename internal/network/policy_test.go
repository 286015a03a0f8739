package network

import (
	"fmt"
	"net/netip"
	"reflect"
	"testing"

	"github.com/forkbox/forkbox/errdefs"
)

func TestParsePolicy(t *testing.T) {
	many := make([]string, MaxListEntries+1)
	for i := range many {
		many[i] = fmt.Sprintf("h%d.example.com", i)
	}
	long := "a"
	for len(long) < 260 {
		long += ".abcdefgh"
	}
	for _, tc := range []struct {
		name        string
		mode        string
		allow, deny []string
		want        Policy // when ok
		ok          bool
	}{
		{"default", "", nil, nil, Policy{Mode: EgressNone}, true},
		{"all", "all", nil, nil, Policy{Mode: EgressAll}, true},
		{"allow implied", "", []string{"API.Example.com.", "10.1.0.0/16", "10.1.0.0/16", "*.example.org", "192.0.2.7"}, nil,
			Policy{Mode: EgressAllow, Allow: []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16"), netip.MustParsePrefix("192.0.2.7/32")},
				AllowNames: []string{"*.example.org", "api.example.com"}}, true},
		{"all minus cidr", "all", nil, []string{"10.2.0.0/16", "fd00::/8"},
			Policy{Mode: EgressAll, Deny: []netip.Prefix{netip.MustParsePrefix("10.2.0.0/16"), netip.MustParsePrefix("fd00::/8")}}, true},
		{"deny name with allow", "allow", []string{"*.example.com"}, []string{"bad.example.com"},
			Policy{Mode: EgressAllow, AllowNames: []string{"*.example.com"}, DenyNames: []string{"bad.example.com"}}, true},
		{"bad cidr", "", []string{"10.1.0.0/33"}, nil, Policy{}, false},
		{"host bits", "", []string{"10.1.2.3/16"}, nil, Policy{}, false},
		{"bad name", "", []string{"exa_mple.com"}, nil, Policy{}, false},
		{"label dash", "", []string{"-a.example.com"}, nil, Policy{}, false},
		{"numeric tld", "", []string{"10.1.2"}, nil, Policy{}, false},
		{"empty entry", "", []string{""}, nil, Policy{}, false},
		{"long name", "", []string{long}, nil, Policy{}, false},
		{"bare wildcard", "", []string{"*.com"}, nil, Policy{}, false},
		{"inner wildcard", "", []string{"a.*.example.com"}, nil, Policy{}, false},
		{"too many", "", many, nil, Policy{}, false},
		{"too many deny", "all", nil, append([]string{"10.0.0.0/8"}, many...), Policy{}, false},
		{"ipv6 allow", "", []string{"2001:db8::/32"}, nil, Policy{}, false},
		{"zone", "", []string{"fe80::1%eth0"}, nil, Policy{}, false},
		{"metadata allow", "", []string{"169.254.169.254"}, nil, Policy{}, false},
		{"loopback allow", "", []string{"127.0.0.0/8"}, nil, Policy{}, false},
		{"none with list", "none", []string{"10.0.0.0/8"}, nil, Policy{}, false},
		{"all with allow", "all", []string{"10.0.0.0/8"}, nil, Policy{}, false},
		{"all deny name", "all", nil, []string{"example.com"}, Policy{}, false},
		{"allow without list", "allow", nil, nil, Policy{}, false},
		{"unknown mode", "some", nil, nil, Policy{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParsePolicy(tc.mode, tc.allow, tc.deny)
			if !tc.ok {
				if !errdefs.IsInvalidArgument(err) {
					t.Fatalf("got %+v, %v; want InvalidArgument", got, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
			// The canonical lists read back to the same policy.
			allow, deny := got.Lists()
			again, err := ParsePolicy(string(got.Mode), allow, deny)
			if err != nil || !reflect.DeepEqual(again, got) {
				t.Fatalf("round trip: got %+v, %v; want %+v", again, err, got)
			}
		})
	}
}

func TestMatchName(t *testing.T) {
	names := []string{"*.corp.example.net", "*.example.org", "api.example.com"}
	for q, want := range map[string]bool{
		"api.example.com": true, "API.example.COM.": true, "x.api.example.com": false, "example.com": false,
		"a.example.org": true, "a.b.example.org.": true, "example.org": false, "badexample.org": false,
		"x.corp.example.net.": true,
		// Escapes in the printed name (as miekg/dns gives a question): the
		// labels are "x.corp", "example", "net", not below corp.example.net.
		`x\.corp.example.net.`: false, `a\.example.org`: false, `api\.example.com`: false,
		`a.b\.example.org.`: false, `\097.example.org`: false, `x\046corp.example.net`: false,
	} {
		if got := MatchName(names, q); got != want {
			t.Errorf("MatchName(%q) = %v, want %v", q, got, want)
		}
	}
}

func TestIntervalElements(t *testing.T) {
	got := intervalElements([]netip.Prefix{netip.MustParsePrefix("10.0.1.0/24"), netip.MustParsePrefix("10.0.0.0/24"),
		netip.MustParsePrefix("10.0.0.128/25"), netip.MustParsePrefix("192.0.2.1/32"), netip.MustParsePrefix("fd00::/8")})
	var s []string
	for _, e := range got {
		a, _ := netip.AddrFromSlice(e.Key)
		s = append(s, fmt.Sprintf("%s/%v", a, e.IntervalEnd))
	}
	want := []string{"10.0.0.0/false", "10.0.2.0/true", "192.0.2.1/false", "192.0.2.2/true"}
	if !reflect.DeepEqual(s, want) {
		t.Errorf("got %v, want %v", s, want)
	}
	if got := intervalElements([]netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")}); len(got) != 1 || got[0].IntervalEnd {
		t.Errorf("0.0.0.0/0: got %+v, want one open-ended start", got)
	}
}
