package placement

import (
	"slices"
	"strings"
	"testing"

	"github.com/forkbox/forkbox/errdefs"
)

func node(name string, used, slots int, mod ...func(*Node)) Node {
	n := Node{Name: name, Ready: true, Runtimes: []string{"gvisor", "crun"}, Slots: slots, Used: used, CanReceive: true,
		RuntimeVersions: map[string]string{"gvisor": "runsc version release-1", "crun": "crun version 1.8.1"}}
	for _, m := range mod {
		m(&n)
	}
	return n
}

func holding(cks ...string) func(*Node)  { return func(n *Node) { n.Checkpoints = cks } }
func caching(imgs ...string) func(*Node) { return func(n *Node) { n.Images = imgs } }

func TestPlaceScoring(t *testing.T) {
	for _, tc := range []struct {
		name  string
		nodes []Node
		req   Request
		want  string
	}{
		{"least loaded", []Node{node("a", 5, 10), node("b", 1, 10), node("c", 9, 10)}, Request{}, "b"},
		{"ties go to the name", []Node{node("b", 0, 10), node("a", 0, 10)}, Request{}, "a"},
		{"image cached beats load", []Node{node("a", 0, 10), node("b", 8, 10, caching("img"))}, Request{Image: "img"}, "b"},
		{"ancestor beats image", []Node{node("a", 0, 10, caching("img")), node("b", 9, 10, holding("ck0"))},
			Request{Image: "img", Checkpoint: "ck1", Ancestors: []string{"ck0"}, CanTransfer: true}, "b"},
		{"nearer ancestor wins", []Node{node("a", 0, 10, holding("ck-grand")), node("b", 5, 10, holding("ck-parent"))},
			Request{Checkpoint: "ck", Ancestors: []string{"ck-parent", "ck-grand"}, CanTransfer: true}, "b"},
		{"checkpoint beats everything", []Node{node("a", 0, 10, caching("img"), holding("anc")), node("b", 9, 10, holding("ck"))},
			Request{Image: "img", Checkpoint: "ck", Ancestors: []string{"anc"}, CanTransfer: true}, "b"},
		{"not ready is filtered", []Node{node("a", 0, 10, func(n *Node) { n.Ready = false }), node("b", 9, 10)}, Request{}, "b"},
		{"cordoned is filtered", []Node{node("a", 0, 10, func(n *Node) { n.Unschedulable = true }), node("b", 9, 10)}, Request{}, "b"},
		{"runtime is filtered", []Node{node("a", 0, 10, func(n *Node) { n.Runtimes = []string{"crun"} }), node("b", 9, 10)},
			Request{Runtime: "gvisor"}, "b"},
		{"full is filtered", []Node{node("a", 10, 10, holding("ck")), node("b", 0, 10)}, Request{Checkpoint: "ck", CanTransfer: true}, "b"},
		{"a node that cannot receive is filtered", []Node{node("a", 10, 10, holding("ck")), node("b", 0, 10, func(n *Node) { n.CanReceive = false }), node("c", 9, 10)},
			Request{Checkpoint: "ck", CanTransfer: true}, "c"},
		{"a memory checkpoint goes to the same runsc", []Node{node("a", 10, 10, holding("ck")), node("b", 0, 10, func(n *Node) { n.RuntimeVersions["gvisor"] = "runsc version release-2" }), node("c", 9, 10)},
			Request{Runtime: "gvisor", Checkpoint: "ck", CanTransfer: true, RuntimeVersion: "runsc version release-1", RuntimeVersionNode: "a"}, "c"},
		{"a resumed session goes to its node only", []Node{node("a", 0, 10, holding("ck")), node("b", 9, 10)},
			Request{Checkpoint: "ck", CanTransfer: true, Only: "b"}, "b"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Place(tc.nodes, tc.req)
			if err != nil || got != tc.want {
				t.Fatalf("got %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

func TestPlaceNoFit(t *testing.T) {
	for _, tc := range []struct {
		name    string
		nodes   []Node
		req     Request
		class   func(error) bool
		message string
	}{
		{"no nodes", nil, Request{}, errdefs.IsResourceExhausted, "no forkbox node"},
		{"all full", []Node{node("a", 2, 2), node("b", 1, 1)}, Request{}, errdefs.IsResourceExhausted, "a: full (2/2 slots); b: full (1/1 slots)"},
		{"checkpoint only on a full node", []Node{node("a", 2, 2, holding("ck")), node("b", 0, 5)}, Request{Checkpoint: "ck"},
			errdefs.IsFailedPrecondition, "checkpoint ck not on any node with room"},
		{"another runsc version", []Node{node("a", 2, 2, holding("ck")), node("b", 0, 5, func(n *Node) { n.RuntimeVersions["gvisor"] = "runsc version release-2" })},
			Request{Runtime: "gvisor", Checkpoint: "ck", CanTransfer: true, RuntimeVersion: "runsc version release-1", RuntimeVersionNode: "a"},
			errdefs.IsFailedPrecondition, `b: runs gvisor "runsc version release-2", not "runsc version release-1" as on node a, where memory checkpoint ck was taken`},
		{"the session's node is not ready", []Node{node("a", 0, 10), node("b", 0, 10, func(n *Node) { n.Ready = false })}, Request{Only: "b"},
			errdefs.IsUnavailable, "node b, which holds the session's ledger, is not ready"},
		{"the session's node is gone", []Node{node("a", 0, 10)}, Request{Only: "b"},
			errdefs.IsUnavailable, "node b, which holds the session's ledger, is not registered"},
		{"the session's node is full", []Node{node("a", 0, 10), node("b", 3, 3)}, Request{Only: "b"},
			errdefs.IsResourceExhausted, "node b, which holds the session's ledger, is full (3/3 slots)"},
		{"the session's node lacks the runtime", []Node{node("b", 0, 3, func(n *Node) { n.Runtimes = []string{"crun"} })}, Request{Runtime: "gvisor", Only: "b"},
			errdefs.IsFailedPrecondition, "node b, which holds the session's ledger: no runtime gvisor"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Place(tc.nodes, tc.req)
			if err == nil || !tc.class(err) || !strings.Contains(err.Error(), tc.message) {
				t.Fatalf("got %q, %v; want an error of the right class containing %q", got, err, tc.message)
			}
		})
	}
}

// A fork's children fill the checkpoint's node, then spill: with
// transfers to the best other node, without them into a clear error.
func TestPlaceManyFillsThenSpills(t *testing.T) {
	nodes := []Node{node("src", 1, 4, holding("ck")), node("x", 0, 10), node("y", 3, 10, caching("img"))}
	got, errs := PlaceMany(nodes, Request{Image: "img", Checkpoint: "ck", CanTransfer: true}, 6)
	want := []string{"src", "src", "src", "y", "y", "y"}
	if !slices.Equal(got, want) || slices.ContainsFunc(errs, func(e error) bool { return e != nil }) {
		t.Fatalf("got %v (errors %v), want %v", got, errs, want)
	}
	if nodes[0].Used != 1 {
		t.Fatalf("PlaceMany changed its input: Used = %d", nodes[0].Used)
	}
	got, errs = PlaceMany(nodes, Request{Image: "img", Checkpoint: "ck"}, 5)
	for i := range got {
		if i < 3 && (got[i] != "src" || errs[i] != nil) {
			t.Fatalf("child %d: got %q, %v; want src", i, got[i], errs[i])
		}
		if i >= 3 && (got[i] != "" || !errdefs.IsFailedPrecondition(errs[i])) {
			t.Fatalf("child %d: got %q, %v; want FailedPrecondition", i, got[i], errs[i])
		}
	}
}
