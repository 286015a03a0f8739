package daemon

import (
	"context"
	"errors"
	"reflect"
	"slices"
	"testing"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/network"
	"github.com/forkbox/forkbox/internal/store"
)

// TestEgressLists: a create's lists reach the store and the network; a
// live change replaces them and is in the ledger; forks inherit them or
// take their overrides; a restarted daemon applies them again.
func TestEgressLists(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	net := fakeNet{h.w}
	id := h.create(CreateOptions{Name: "src", EgressAllow: []string{"api.example.com", "10.1.0.0/16"}, EgressDeny: []string{"10.1.2.0/24"}})
	sb, err := h.d.store.GetSandbox(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := sb.Config, (store.SandboxConfig{Egress: "allow", EgressAllow: []string{"10.1.0.0/16", "api.example.com"}, EgressDeny: []string{"10.1.2.0/24"}}); got.Egress != want.Egress ||
		!reflect.DeepEqual(got.EgressAllow, want.EgressAllow) || !reflect.DeepEqual(got.EgressDeny, want.EgressDeny) {
		t.Fatalf("recorded egress: got %q %v %v, want %q %v %v", got.Egress, got.EgressAllow, got.EgressDeny, want.Egress, want.EgressAllow, want.EgressDeny)
	}
	if pol := net.policy(id); pol.Mode != network.EgressAllow || !slices.Equal(pol.AllowNames, []string{"api.example.com"}) || len(pol.Deny) != 1 {
		t.Fatalf("network policy: %+v", pol)
	}

	// Forks inherit; an override replaces the whole policy.
	res, err := h.d.Fork(ctx, ForkOptions{Source: id, Count: 1})
	if err != nil || res.Children[0].Err != nil {
		t.Fatalf("fork: %v %+v", err, res)
	}
	child := res.Children[0].Sandbox
	if pol := net.policy(child.ID); pol.Mode != network.EgressAllow || !slices.Equal(pol.AllowNames, []string{"api.example.com"}) {
		t.Errorf("the child's policy: %+v, want the parent's", pol)
	}
	res, err = h.d.Fork(ctx, ForkOptions{Source: id, Count: 1, Overrides: Overrides{EgressAllow: []string{"other.example.com"}}})
	if err != nil || res.Children[0].Err != nil {
		t.Fatalf("fork: %v %+v", err, res)
	}
	if pol := net.policy(res.Children[0].Sandbox.ID); !slices.Equal(pol.AllowNames, []string{"other.example.com"}) || len(pol.Allow)+len(pol.Deny) != 0 {
		t.Errorf("the overridden child's policy: %+v, want only other.example.com", pol)
	}

	// A live change.
	if _, err := h.d.SetEgress(ctx, "src", EgressOptions{Egress: "all", Deny: []string{"192.0.2.0/24"}}); err != nil {
		t.Fatal(err)
	}
	if pol := net.policy(id); pol.Mode != network.EgressAll || len(pol.Deny) != 1 || len(pol.AllowNames) != 0 {
		t.Errorf("after SetEgress: %+v", pol)
	}
	if evs := h.events(id); !slices.Contains(evs, store.EventEgressChanged) {
		t.Errorf("ledger %v has no %s", evs, store.EventEgressChanged)
	}
	// Bad input changes nothing.
	for _, o := range []EgressOptions{{Allow: []string{"10.0.0.0/99"}}, {Egress: "none", Deny: []string{"10.0.0.0/8"}}, {Allow: []string{"bad name"}}} {
		if _, err := h.d.SetEgress(ctx, id, o); !errdefs.IsInvalidArgument(err) {
			t.Errorf("SetEgress(%+v): %v, want InvalidArgument", o, err)
		}
	}
	if _, err := h.d.SetEgress(ctx, "sb-nope", EgressOptions{Egress: "none"}); !errdefs.IsNotFound(err) {
		t.Errorf("SetEgress of an unknown sandbox: %v, want NotFound", err)
	}
	if pol := net.policy(id); pol.Mode != network.EgressAll {
		t.Errorf("after refused changes: %+v", pol)
	}

	// A restart applies the recorded policy again.
	h.w.mu.Lock()
	h.w.egress[id] = network.Policy{}
	h.w.mu.Unlock()
	h.reopen(h.runtimes(RuntimeGVisor, RuntimeCrun))
	if pol := net.policy(id); pol.Mode != network.EgressAll || len(pol.Deny) != 1 {
		t.Errorf("after a restart: %+v, want the recorded policy", pol)
	}

	// A closed sandbox cannot change.
	if err := h.d.Delete(ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, err := h.d.SetEgress(ctx, id, EgressOptions{Egress: "none"}); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("SetEgress of a closed sandbox: %v, want FailedPrecondition", err)
	}
}

// TestEgressNamesNeedDNS: when the DNS proxy did not start, a create or a
// change with names on its allow list fails Unavailable (the sandbox would
// reach whatever else listens on the gateway's port 53) and changes
// nothing; lists of CIDRs only still work; a restart applies a recorded
// list without its names.
func TestEgressNamesNeedDNS(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	net := fakeNet{h.w}
	h.d.dnsErr = errors.New("listen udp 10.0.0.1:53: address already in use")
	if _, err := h.d.Create(ctx, CreateOptions{Image: "unit:1", Name: "named", EgressAllow: []string{"api.example.com"}}); !errdefs.IsUnavailable(err) {
		t.Fatalf("create with a name, no DNS proxy: %v, want Unavailable", err)
	}
	if sbs, err := h.d.store.ListSandboxes(ctx, false); err == nil {
		for _, sb := range sbs {
			if sb.Name == "named" && sb.State != store.StateClosed {
				t.Errorf("the refused create left sandbox %s in state %s", sb.ID, sb.State)
			}
		}
	}
	id := h.create(CreateOptions{Name: "cidrs", EgressAllow: []string{"192.0.2.0/24"}})
	if _, err := h.d.SetEgress(ctx, id, EgressOptions{Allow: []string{"api.example.com", "192.0.2.0/24"}}); !errdefs.IsUnavailable(err) {
		t.Errorf("SetEgress with a name, no DNS proxy: %v, want Unavailable", err)
	}
	if pol := net.policy(id); pol.Mode != network.EgressAllow || len(pol.AllowNames) != 0 || len(pol.Allow) != 1 {
		t.Errorf("after the refused change: %+v, want the CIDR list", pol)
	}
	sb, err := h.d.store.GetSandbox(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(sb.Config.EgressAllow, "api.example.com") {
		t.Errorf("the refused change was recorded: %v", sb.Config.EgressAllow)
	}
	if _, err := h.d.SetEgress(ctx, id, EgressOptions{Egress: "all"}); err != nil {
		t.Errorf("SetEgress all, no DNS proxy: %v", err)
	}
}
