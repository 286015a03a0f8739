package clusterlab

import "testing"

func TestParsePull(t *testing.T) {
	tests := []struct {
		msg  string
		want Pull
		ok   bool
	}{
		{"node b pulled from node a: full, 20994915 bytes in 760 ms", Pull{Node: "b", From: "a", Bytes: 20994915, MS: 760}, true},
		{"node a pulled from node b: incremental from ck-x, 1050000 bytes in 41 ms; image e2e.local/app:1 fetched from node b: 1156 bytes in 95 ms",
			Pull{Node: "a", From: "b", Parent: "ck-x", Bytes: 1050000, MS: 41}, true},
		{"node b is pulling it from node a", Pull{}, false},
		{"node b pulled from node a: full, 99999999999999999999 bytes in 1 ms", Pull{}, false},
		{"", Pull{}, false},
	}
	for _, tc := range tests {
		got, ok := ParsePull(tc.msg)
		if ok != tc.ok || got != tc.want {
			t.Errorf("ParsePull(%q) = %+v, %v; want %+v, %v", tc.msg, got, ok, tc.want, tc.ok)
		}
	}
}
