package main

import (
	"strings"
	"testing"
)

// clusterResult is a result of the given ready p50s (ms) per case, one
// sample each, finished as the section finishes it.
func clusterResult(size string, bytes int64, same, full, reuse, incr float64) ClusterResult {
	r := ClusterResult{Size: size, Bytes: bytes, Files: bytes / fileSize, SourceNode: "a", OtherNode: "b", Reps: 1, Runtime: "crun"}
	var s clusterSamples
	s.add(caseSame, same)
	s.add(caseFull, full, Send{Bytes: bytes, MS: int64(full / 2)})
	s.add(caseReuse, reuse)
	s.add(caseIncr, incr, Send{Bytes: 1_000_000, MS: 20, Parent: "s0-0-ck"})
	r.finish(s)
	return r
}

func TestClusterFinish(t *testing.T) {
	r := ClusterResult{Size: "100MB", Bytes: 100_000_000, SourceNode: "a", OtherNode: "b"}
	var s clusterSamples
	for _, x := range []struct {
		same, full, reuse, incr float64
		sent                    int64
	}{{100, 1500, 110, 300, 104_000_000}, {300, 1700, 90, 500, 106_000_000}, {200, 1600, 100, 400, 105_000_000}} {
		s.add(caseSame, x.same)
		s.add(caseFull, x.full, Send{Bytes: x.sent, MS: int64(x.full) - 500})
		s.add(caseReuse, x.reuse)
		s.add(caseIncr, x.incr, Send{Bytes: 1_050_000, MS: 40, Parent: "ck"})
	}
	s.capture, s.single, s.singleCapture = []float64{10, 30, 20}, []float64{50, 40, 60}, []float64{5, 4, 6}
	r.finish(s)

	want := []struct {
		name, node string
		p50, over  float64
		sent       int64
		sends      int
		transfer   float64
	}{
		{caseSame, "a", 200, 1, 0, 0, 0},
		{caseFull, "b", 1600, 8, 105_000_000, 3, 1100},
		{caseReuse, "b", 100, 0.5, 0, 0, 0},
		{caseIncr, "a", 400, 2, 1_050_000, 3, 40},
	}
	if len(r.Cases) != len(want) {
		t.Fatalf("got %d cases, want %d", len(r.Cases), len(want))
	}
	for i, w := range want {
		c := r.Cases[i]
		if c.Case != w.name || c.Node != w.node || c.Ready.Median != w.p50 || c.OverSameNode != w.over ||
			c.SentBytes != w.sent || len(c.Sends) != w.sends || c.Transfer.Median != w.transfer || c.Ready.N != 3 {
			t.Errorf("case %d: got %s on %s p50 %v (n=%d) over %v sent %d (%d sends, transfer %v), want %s on %s p50 %v over %v sent %d (%d sends, transfer %v)",
				i, c.Case, c.Node, c.Ready.Median, c.Ready.N, c.OverSameNode, c.SentBytes, len(c.Sends), c.Transfer.Median,
				w.name, w.node, w.p50, w.over, w.sent, w.sends, w.transfer)
		}
	}
	if r.Capture.Median != 20 || r.SingleHost.Median != 50 || r.SingleHostCapture.Median != 5 {
		t.Errorf("got capture %v, single host %v (capture %v), want 20, 50 (5)", r.Capture.Median, r.SingleHost.Median, r.SingleHostCapture.Median)
	}
}

func TestClusterTargets(t *testing.T) {
	tests := []struct {
		name string
		r    ClusterResult
		want []Target // What is matched by prefix
	}{
		{"100MB all met", clusterResult("100MB", 100_000_000, 200, 1500, 220, 400), []Target{
			{What: "cluster: cross-node fork of a 100MB checkpoint", Goal: 2000, Got: 1500, Met: true},
			{What: "cluster: replica already on the node", Goal: 240, Got: 220, Met: true},
		}},
		{"100MB full too slow, replica too slow", clusterResult("100MB", 100_000_000, 200, 2000, 250, 400), []Target{
			{What: "cluster: cross-node fork of a 100MB checkpoint", Goal: 2000, Got: 2000, Met: false},
			{What: "cluster: replica already on the node", Goal: 240, Got: 250, Met: false},
		}},
		{"smaller source held to the same 2 s", clusterResult("10MB", 10_000_000, 100, 900, 100, 200), []Target{
			{What: "cluster: cross-node fork of a 10MB checkpoint", Goal: 2000, Got: 900, Met: true},
			{What: "cluster: replica already on the node", Goal: 120, Got: 100, Met: true},
		}},
		{"1GB: no 2 s goal, the replica still held to same-node", clusterResult("1GB", 1_000_000_000, 300, 15000, 500, 600), []Target{
			{What: "cluster: replica already on the node", Goal: 360, Got: 500, Met: false},
		}},
		{"no samples, no targets", ClusterResult{Size: "100MB", Bytes: 100_000_000}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := clusterTargets([]ClusterResult{tc.r})
			if len(got) != len(tc.want) {
				t.Fatalf("got %d targets %+v, want %d", len(got), got, len(tc.want))
			}
			for i, w := range tc.want {
				g := got[i]
				if !strings.HasPrefix(g.What, w.What) || !near(g.Goal, w.Goal) || g.Got != w.Got || g.Met != w.Met {
					t.Errorf("target %d: got %+v, want %+v", i, g, w)
				}
			}
		})
	}
}

func near(a, b float64) bool { return a-b < 1e-9 && b-a < 1e-9 }

func TestClusterTableShowsTargets(t *testing.T) {
	var out strings.Builder
	printCluster(&out, []ClusterResult{clusterResult("100MB", 100_000_000, 200, 2500, 220, 400)})
	if want := "(sources in files of 20 KB, 100MB in 5000; "; !strings.Contains(out.String(), want) {
		t.Errorf("table:\n%s\nwant it to contain %q", out.String(), want)
	}
	lines := map[string]string{}
	for _, l := range strings.Split(out.String(), "\n") {
		for _, k := range clusterCases {
			if strings.Contains(l, k.what) {
				lines[k.name] = l
			}
		}
	}
	for name, want := range map[string][]string{
		caseSame:  {"200 / 200", "1.00x"},
		caseFull:  {"2500 / 2500", "12.50x", "100 MB (full)", "< 2000 ms: MISSED"},
		caseReuse: {"220 / 220", "1.10x", "< 240 ms: met"},
		caseIncr:  {"400 / 400", "1.00 MB (incremental)"},
	} {
		for _, w := range want {
			if !strings.Contains(lines[name], w) {
				t.Errorf("row %s: got %q, want it to contain %q", name, lines[name], w)
			}
		}
	}
}

func TestSendKinds(t *testing.T) {
	tests := []struct {
		sends []Send
		want  string
	}{
		{[]Send{{Parent: "x"}, {Parent: "x"}}, " (incremental)"},
		{[]Send{{}, {}}, " (full)"},
		{[]Send{{}, {Parent: "x"}, {Parent: "x"}}, " (1 of 3 full)"},
	}
	for _, tc := range tests {
		if got := sendKinds(tc.sends); got != tc.want {
			t.Errorf("sendKinds(%+v) = %q, want %q", tc.sends, got, tc.want)
		}
	}
}

func TestClusterFlags(t *testing.T) {
	o, err := parseFlags([]string{"--sections", "cluster", "--cluster-sizes", "100MB,1GB"})
	if err != nil {
		t.Fatal(err)
	}
	if o.singleHost() || o.clusterRuntime != "crun" || o.clusterReps != 3 || len(o.clusterSizes) != 2 {
		t.Errorf("got singleHost %v, runtime %q, reps %d, sizes %v; want false, crun, 3, [100MB 1GB]", o.singleHost(), o.clusterRuntime, o.clusterReps, o.clusterSizes)
	}
	if o, _ := parseFlags([]string{"--sections", "fork,cluster"}); !o.singleHost() {
		t.Errorf("fork,cluster: singleHost false, want true")
	}
	if o, _ := parseFlags(nil); o.sections["cluster"] {
		t.Errorf("the default sections include cluster; want it opt-in")
	}
	for _, args := range [][]string{
		{"--sections", "cluster", "--cluster-sizes", "big"},
		{"--sections", "cluster", "--cluster-reps", "0"},
		{"--sections", "cluster", "--cluster-runtime", "runc"},
	} {
		if _, err := parseFlags(args); err == nil {
			t.Errorf("parseFlags(%q): no error, want InvalidArgument", args)
		}
	}
}
