package gateway

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/forkbox/forkbox/errdefs"
	fbv1 "github.com/forkbox/forkbox/internal/cluster/api/v1alpha1"
)

// A credential's Secret name is DNS-valid and bounded for any owner name
// (up to a Kubernetes name's 253 bytes) and any credential name the
// daemon accepts, the same for the same pair and another for another.
func TestCredentialSecret(t *testing.T) {
	long := strings.Repeat("a", 199) + "." + strings.Repeat("b", 53)
	seen := map[string]string{}
	for _, owner := range []string{"box-x1", "fork-parent-abcde", long, strings.Repeat("c", 200) + "-d"} {
		for _, cred := range []string{"API_KEY", "token", "key.pem", "a-b", "API-KEY", strings.Repeat("Z", 128)} {
			got := credentialSecret(owner, cred)
			if errs := validation.IsDNS1123Subdomain(got); len(errs) > 0 {
				t.Errorf("credentialSecret(%q, %q) = %q: %v", owner, cred, got, errs)
			}
			if got != credentialSecret(owner, cred) {
				t.Errorf("credentialSecret(%q, %q) is not deterministic", owner, cred)
			}
			if prev, ok := seen[got]; ok {
				t.Errorf("credentialSecret(%q, %q) = %q, as for %s", owner, cred, got, prev)
			}
			seen[got] = owner + "/" + cred
		}
	}
}

// inherit follows the daemon's credentials.Inherit: per-fork ones must be
// given, a value for a credential the source lacks is refused, given
// values are checked with the source's injection.
func TestInherit(t *testing.T) {
	src := &fbv1.Sandbox{Spec: fbv1.SandboxSpec{Credentials: []fbv1.Credential{
		{Name: "API_KEY", SecretRef: fbv1.SecretKeyRef{Name: "s1", Key: "value"}},
		{Name: "token", File: "token", PerFork: true, SecretRef: fbv1.SecretKeyRef{Name: "s2", Key: "value"}},
	}}}
	if _, _, err := inherit(src, nil); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("per-fork not given: got %v, want FailedPrecondition", err)
	}
	if _, _, err := inherit(src, map[string]string{"token": "t", "nope": "x"}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("a value for no credential: got %v, want InvalidArgument", err)
	}
	if _, _, err := inherit(src, map[string]string{"token": strings.Repeat("x", 64<<10+1)}); !errdefs.IsResourceExhausted(err) {
		t.Errorf("an oversized value: got %v, want ResourceExhausted", err)
	}
	kept, given, err := inherit(src, map[string]string{"token": "t"})
	if err != nil || len(kept) != 1 || kept[0].Name != "API_KEY" || len(given) != 1 || given[0].Name != "token" {
		t.Errorf("got kept %v, given %v, %v; want API_KEY kept and token given", kept, given, err)
	}
	if kept, given, err := inherit(nil, nil); err != nil || kept != nil || given != nil {
		t.Errorf("no source: got %v %v %v", kept, given, err)
	}
}
