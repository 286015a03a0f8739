package main

import (
	"fmt"
	"io"
)

// The cluster section's cases, in the order they run in each repetition.
const (
	caseSame  = "same-node"
	caseFull  = "cross-node-full"
	caseReuse = "cross-node-replica"
	caseIncr  = "cross-node-incremental"
)

var clusterCases = []struct{ name, what string }{
	{caseSame, "same node (the checkpoint's)"},
	{caseFull, "other node, first transfer (full)"},
	{caseReuse, "other node, replica already there"},
	{caseIncr, "other node, incremental (a child's checkpoint)"},
}

// Goals of the cluster section (issue 15): a cross-node fork of a
// checkpoint of at most goalCrossBytes ready within goalCrossMS, and a
// child of a replica already on its node within goalReplicaOverSame
// times a same-node child.
const (
	goalCrossMS         = 2000
	goalCrossBytes      = 100_000_000
	goalReplicaOverSame = 1.2
)

// ClusterResult is the cluster section for one source size.
type ClusterResult struct {
	Size    string `json:"size"`
	Bytes   int64  `json:"bytes"`
	Files   int64  `json:"files"`
	Runtime string `json:"runtime"`
	Reps    int    `json:"reps"`
	// SourceNode holds the source and its checkpoints; OtherNode is where
	// the cross-node children of them run (the incremental one runs on
	// SourceNode, from a checkpoint taken on OtherNode).
	SourceNode string `json:"source_node"`
	OtherNode  string `json:"other_node"`
	// SetupMS is the source's creation and writes, once.
	SetupMS float64 `json:"setup_ms"`
	// DeltaBytes is what the child on OtherNode writes before its
	// checkpoint, the one sent incrementally.
	DeltaBytes int64 `json:"delta_bytes"`
	// Capture is a Checkpoint object of the source, created to Ready.
	Capture Summary `json:"checkpoint_capture"`
	// SingleHost is the same source forked through its node's own API
	// (the fork section's call → ready, capture included), and
	// SingleHostCapture that fork's capture.
	SingleHost        Summary       `json:"single_host_fork"`
	SingleHostCapture Summary       `json:"single_host_capture"`
	Cases             []ClusterCase `json:"cases"`
}

// ClusterCase is one way of starting a child of a checkpoint.
type ClusterCase struct {
	Case string `json:"case"`
	// Node is where the child ran.
	Node string `json:"node"`
	// Ready is the child Sandbox object's creation until it is Running
	// and has answered an exec on its node.
	Ready Summary `json:"ready"`
	// OverSameNode is Ready p50 / the same-node case's.
	OverSameNode float64 `json:"over_same_node"`
	// Sends are the pulls the case made, one per repetition.
	Sends []Send `json:"sends,omitempty"`
	// SentBytes is the p50 of the sends' bytes; Transfer the pulls'
	// own time on the receiver (from their Transferred events).
	SentBytes int64   `json:"sent_bytes_p50,omitempty"`
	Transfer  Summary `json:"transfer,omitzero"`
}

// Send is one pull of a checkpoint.
type Send struct {
	Bytes int64 `json:"bytes"`
	MS    int64 `json:"ms"`
	// Parent is the ancestor of an incremental send ("" for a full one).
	Parent string `json:"parent,omitempty"`
}

// clusterSamples are one size's raw measurements, in ms.
type clusterSamples struct {
	capture, single, singleCapture []float64
	ready                          map[string][]float64
	sends                          map[string][]Send
}

func (s *clusterSamples) add(c string, readyMS float64, sends ...Send) {
	if s.ready == nil {
		s.ready, s.sends = map[string][]float64{}, map[string][]Send{}
	}
	s.ready[c] = append(s.ready[c], readyMS)
	s.sends[c] = append(s.sends[c], sends...)
}

// finish summarizes s into r: medians, ratios to the same-node case and
// the sends' sizes.
func (r *ClusterResult) finish(s clusterSamples) {
	r.Capture, r.SingleHost, r.SingleHostCapture = summarize(s.capture), summarize(s.single), summarize(s.singleCapture)
	r.Cases = nil
	for _, k := range clusterCases {
		c := ClusterCase{Case: k.name, Node: r.OtherNode, Ready: summarize(s.ready[k.name]), Sends: s.sends[k.name]}
		if k.name == caseSame || k.name == caseIncr {
			c.Node = r.SourceNode
		}
		var bytes, took []float64
		for _, x := range c.Sends {
			bytes, took = append(bytes, float64(x.Bytes)), append(took, float64(x.MS))
		}
		c.SentBytes, c.Transfer = int64(median(bytes)), summarize(took)
		r.Cases = append(r.Cases, c)
	}
	same := r.Cases[0].Ready.Median
	for i := range r.Cases {
		r.Cases[i].OverSameNode = ratio(r.Cases[i].Ready.Median, same)
	}
}

func (r *ClusterResult) find(name string) *ClusterCase {
	for i := range r.Cases {
		if r.Cases[i].Case == name {
			return &r.Cases[i]
		}
	}
	return nil
}

// caseTarget is the goal case c is held to, if any: the full transfer of
// a checkpoint of at most goalCrossBytes, and the reused replica.
func (r *ClusterResult) caseTarget(c *ClusterCase) *Target {
	if c.Ready.N == 0 {
		return nil
	}
	switch c.Case {
	case caseFull:
		if r.Bytes > goalCrossBytes {
			return nil
		}
		return &Target{What: fmt.Sprintf("cluster: cross-node fork of a %s checkpoint, first (full) transfer, ready p50", r.Size),
			Goal: goalCrossMS, Got: c.Ready.Median, Met: c.Ready.Median < goalCrossMS}
	case caseReuse:
		same := r.find(caseSame)
		if same == nil || same.Ready.N == 0 {
			return nil
		}
		goal := goalReplicaOverSame * same.Ready.Median
		return &Target{What: fmt.Sprintf("cluster: replica already on the node, ready p50 within %.1fx same-node (%s)", goalReplicaOverSame, r.Size),
			Goal: goal, Got: c.Ready.Median, Met: c.Ready.Median < goal}
	}
	return nil
}

// clusterTargets are the cluster section's goals and how rs did.
func clusterTargets(rs []ClusterResult) []Target {
	var ts []Target
	for i := range rs {
		for j := range rs[i].Cases {
			if t := rs[i].caseTarget(&rs[i].Cases[j]); t != nil {
				ts = append(ts, *t)
			}
		}
	}
	return ts
}

func printCluster(w io.Writer, rs []ClusterResult) {
	if len(rs) == 0 {
		return
	}
	fmt.Fprintf(w, "cluster: forks on the 3-node test cluster (%s, n=%d each): ready = the child Sandbox created → Running and an exec answered on its node\n",
		rs[0].Runtime, rs[0].Reps)
	fmt.Fprintln(w, "size\tcase\tnode\tready\t/same-node\tsent p50\ttransfer\ttarget\t")
	for _, r := range rs {
		for i := range r.Cases {
			c := &r.Cases[i]
			what := c.Case
			for _, k := range clusterCases {
				if k.name == c.Case {
					what = k.what
				}
			}
			sent, took := "-", "-"
			if len(c.Sends) > 0 {
				sent, took = megabytes(c.SentBytes)+sendKinds(c.Sends), pp(c.Transfer)
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%.2fx\t%s\t%s\t%s\t\n", r.Size, what, c.Node, pp(c.Ready), c.OverSameNode, sent, took, verdict(r.caseTarget(c)))
		}
		fmt.Fprintf(w, "%s\tsingle host: fork call on %s (capture incl.)\t%s\t%s\t%.2fx\t\t\t\t\n", r.Size, r.SourceNode, r.SourceNode,
			pp(r.SingleHost), ratio(r.SingleHost.Median, r.Cases[0].Ready.Median))
		fmt.Fprintf(w, "%s\tcheckpoint object → Ready (single host: capture %s)\t%s\t%s\t\t\t\t\t\n", r.Size, pp(r.SingleHostCapture), r.SourceNode, pp(r.Capture))
	}
	files := ""
	for _, r := range rs {
		files += fmt.Sprintf(", %s in %d", r.Size, r.Files)
	}
	fmt.Fprintf(w, "(sources in files of 20 KB%s; the incremental child's parent wrote %s more; sent = the btrfs stream and the files beside it)\n\n",
		files, megabytes(rs[0].DeltaBytes))
}

// verdict is a target's status for a table cell.
func verdict(t *Target) string {
	if t == nil {
		return ""
	}
	status := "met"
	if !t.Met {
		status = "MISSED"
	}
	return fmt.Sprintf("< %s ms: %s", num(t.Goal), status)
}

// sendKinds says, for a table cell, when a case's sends were not all of
// the kind its name promises (a full one among incremental ones).
func sendKinds(ss []Send) string {
	full := 0
	for _, s := range ss {
		if s.Parent == "" {
			full++
		}
	}
	switch full {
	case 0:
		return " (incremental)"
	case len(ss):
		return " (full)"
	}
	return fmt.Sprintf(" (%d of %d full)", full, len(ss))
}

func megabytes(b int64) string { return num(float64(b)/1e6) + " MB" }
