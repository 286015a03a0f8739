// Package placement chooses the node a sandbox runs on. It is pure: the
// controller gathers the facts (nodes, their load, where checkpoints
// live) and this package filters and scores them, so the rules are tested
// in milliseconds and the controller only moves data.
//
// Filter: the node is Ready and schedulable, offers the runtime, and has
// a free slot; a sandbox started from a checkpoint also needs the
// checkpoint on the node, or the node able to receive it when it can be
// shipped (Request.CanTransfer, Node.CanReceive); a memory checkpoint is
// only shipped to a node whose runtime has the version it was taken with
// (Request.RuntimeVersion).
//
// Score, highest first: the checkpoint on the node ≫ an ancestor of it on
// the node (nearer is better) ≫ the image cached ≫ least loaded. Each
// tier outweighs every lower one together; ties go to the name, so a
// placement is deterministic.
package placement

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/forkbox/forkbox/errdefs"
)

// Node is what placement knows of one node.
type Node struct {
	Name          string
	Ready         bool
	Unschedulable bool
	// Runtimes the node offers ("gvisor", "crun").
	Runtimes []string
	// Slots is how many live sandboxes it takes; Used how many it has
	// (bound to it and not failed).
	Slots, Used int
	// Images cached on the node.
	Images []string
	// Checkpoints the node holds a ready copy of (object names).
	Checkpoints []string
	// CanReceive: the node can pull a checkpoint from another.
	CanReceive bool
	// RuntimeVersions: runtime name → version.
	RuntimeVersions map[string]string
}

// Request is the sandbox to place.
type Request struct {
	// Runtime asked for ("" = any).
	Runtime string
	// Image the sandbox runs ("" when unknown).
	Image string
	// Checkpoint it starts from ("" = a fresh sandbox) and that
	// checkpoint's ancestors, nearest first.
	Checkpoint string
	Ancestors  []string
	// CanTransfer: a checkpoint can be shipped to a node that lacks it.
	CanTransfer bool
	// RuntimeVersion, when set, is the version of Runtime a node that
	// lacks the checkpoint must run to start it (a memory checkpoint
	// restores only under the runtime that saved it); RuntimeVersionNode
	// is the node it was taken on.
	RuntimeVersion, RuntimeVersionNode string
	// Only, when set, is the one node the sandbox may run on: a resumed
	// session's, whose ledger holds what is replayed.
	Only string
}

// Score tiers: each outweighs the sum of all lower ones, and so does one
// generation of ancestry (the score is lexicographic: checkpoint, nearest
// ancestor, image, load).
const (
	scoreCheckpoint = 1_000_000_000
	scoreAncestor   = 100_000_000 // minus scoreGeneration per generation away
	scoreGeneration = 10_000
	maxGenerations  = 999
	scoreImage      = 1_000
	scoreLoad       = 100 // times the free fraction
)

// Candidate is a node that passed the filter, with its score.
type Candidate struct {
	Node  string
	Score int
}

// Rank returns the nodes that fit, best first, and why the others do not
// (node name → reason).
func Rank(nodes []Node, req Request) ([]Candidate, map[string]string) {
	var out []Candidate
	rejected := map[string]string{}
	for _, n := range nodes {
		if why := filter(n, req); why != "" {
			rejected[n.Name] = why
			continue
		}
		out = append(out, Candidate{Node: n.Name, Score: score(n, req)})
	}
	slices.SortFunc(out, func(a, b Candidate) int {
		if c := cmp.Compare(b.Score, a.Score); c != 0 {
			return c
		}
		return strings.Compare(a.Node, b.Node)
	})
	return out, rejected
}

func filter(n Node, req Request) string {
	switch {
	case !n.Ready:
		return "not ready"
	case req.Only != "" && n.Name != req.Only:
		return "not node " + req.Only + ", which holds the session's ledger"
	case n.Unschedulable:
		return "unschedulable"
	case req.Runtime != "" && !slices.Contains(n.Runtimes, req.Runtime):
		return "no runtime " + req.Runtime
	case n.Used >= n.Slots:
		return fmt.Sprintf("full (%d/%d slots)", n.Used, n.Slots)
	case req.Checkpoint != "" && !slices.Contains(n.Checkpoints, req.Checkpoint):
		if !req.CanTransfer || !n.CanReceive {
			return "does not hold checkpoint " + req.Checkpoint
		}
		if v := n.RuntimeVersions[req.Runtime]; req.RuntimeVersion != "" && v != req.RuntimeVersion {
			return fmt.Sprintf("%s %s%s, not %q as on node %s, where memory checkpoint %s was taken", runtimeVersionReason, req.Runtime, versionOf(v), req.RuntimeVersion, req.RuntimeVersionNode, req.Checkpoint)
		}
	}
	return ""
}

// runtimeVersionReason starts the reason of a node refused for its
// runtime's version.
const runtimeVersionReason = "runs"

func versionOf(v string) string {
	if v == "" {
		return " of unknown version"
	}
	return fmt.Sprintf(" %q", v)
}

func score(n Node, req Request) int {
	s := 0
	switch {
	case req.Checkpoint != "" && slices.Contains(n.Checkpoints, req.Checkpoint):
		s += scoreCheckpoint
	default:
		for i, a := range req.Ancestors {
			if slices.Contains(n.Checkpoints, a) {
				s += scoreAncestor - scoreGeneration*min(i, maxGenerations)
				break
			}
		}
	}
	if req.Image != "" && slices.Contains(n.Images, req.Image) {
		s += scoreImage
	}
	if n.Slots > 0 {
		s += scoreLoad * (n.Slots - n.Used) / n.Slots
	}
	return s
}

// Place returns the best node for req. No node that fits is an error:
// FailedPrecondition when nodes with room exist but none holds the
// checkpoint or can receive it (or runs the runtime version a memory
// checkpoint needs), ResourceExhausted otherwise; the message names each
// node's reason.
func Place(nodes []Node, req Request) (string, error) {
	ranked, rejected := Rank(nodes, req)
	if len(ranked) > 0 {
		return ranked[0].Node, nil
	}
	return "", noFit(nodes, req, rejected)
}

func noFit(nodes []Node, req Request, rejected map[string]string) error {
	if len(nodes) == 0 {
		return fmt.Errorf("no forkbox node is registered: %w", errdefs.ErrResourceExhausted)
	}
	if req.Only != "" {
		return onlyNoFit(req.Only, rejected)
	}
	names := make([]string, 0, len(rejected))
	for n := range rejected {
		names = append(names, n)
	}
	slices.Sort(names)
	parts := make([]string, len(names))
	lacksCheckpoint := false
	for i, n := range names {
		parts[i] = n + ": " + rejected[n]
		lacksCheckpoint = lacksCheckpoint || strings.HasPrefix(rejected[n], "does not hold") || strings.HasPrefix(rejected[n], runtimeVersionReason+" ")
	}
	detail := strings.Join(parts, "; ")
	if lacksCheckpoint {
		return fmt.Errorf("checkpoint %s not on any node with room (%s): %w", req.Checkpoint, detail, errdefs.ErrFailedPrecondition)
	}
	return fmt.Errorf("no node fits (%s): %w", detail, errdefs.ErrResourceExhausted)
}

// PlaceMany places count sandboxes of one request in turn, each taking a
// slot of its node, and returns the node of each ("" where none fits,
// with that child's error). Children of a fork land on the checkpoint's
// node until it is full, then spill to the next best.
func PlaceMany(nodes []Node, req Request, count int) ([]string, []error) {
	nodes = slices.Clone(nodes)
	out := make([]string, count)
	errs := make([]error, count)
	for i := range count {
		name, err := Place(nodes, req)
		if err != nil {
			errs[i] = err
			continue
		}
		out[i] = name
		for j := range nodes {
			if nodes[j].Name == name {
				nodes[j].Used++
			}
		}
	}
	return out, errs
}

// onlyNoFit says why the one node a request may run on does not fit: a
// node that is gone or not Ready is Unavailable (it may come back), a full
// one ResourceExhausted, any other reason FailedPrecondition.
func onlyNoFit(only string, rejected map[string]string) error {
	why, ok := rejected[only]
	switch {
	case !ok:
		return fmt.Errorf("node %s, which holds the session's ledger, is not registered: %w", only, errdefs.ErrUnavailable)
	case why == "not ready":
		return fmt.Errorf("node %s, which holds the session's ledger, is not ready: %w", only, errdefs.ErrUnavailable)
	case strings.HasPrefix(why, "full "):
		return fmt.Errorf("node %s, which holds the session's ledger, is %s: %w", only, why, errdefs.ErrResourceExhausted)
	}
	return fmt.Errorf("node %s, which holds the session's ledger: %s: %w", only, why, errdefs.ErrFailedPrecondition)
}
