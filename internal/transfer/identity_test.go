package transfer

import (
	"context"
	"strings"
	"testing"

	"github.com/forkbox/forkbox/errdefs"
)

// A certificate is its node's; one no node publishes is refused, and so
// is one two nodes publish (a node may publish another's, which is
// public): its holder is taken for neither.
func TestStaticTrustNodeOf(t *testing.T) {
	ctx := context.Background()
	a, _, err := NewIdentity("a")
	if err != nil {
		t.Fatal(err)
	}
	b, _, err := NewIdentity("b")
	if err != nil {
		t.Fatal(err)
	}
	der := func(id *Identity) []byte {
		d, err := CertDER(id.CertPEM)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	trust := StaticTrust{"a": a.CertPEM}
	if got, err := trust.NodeOf(ctx, der(a)); err != nil || got != "a" {
		t.Errorf("a's certificate: got %q, %v; want a", got, err)
	}
	if _, err := trust.NodeOf(ctx, der(b)); !errdefs.IsPermissionDenied(err) {
		t.Errorf("a certificate no node publishes: got %v, want PermissionDenied", err)
	}
	trust["evil"] = a.CertPEM
	for range 20 { // map order: every time
		if got, err := trust.NodeOf(ctx, der(a)); !errdefs.IsPermissionDenied(err) || !strings.Contains(err.Error(), "a, evil") {
			t.Fatalf("a certificate two nodes publish: got %q, %v; want PermissionDenied naming both", got, err)
		}
	}
}
