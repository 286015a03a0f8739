package main

import (
	"strings"
	"testing"
)

func TestParsePhases(t *testing.T) {
	log := `time=x level=DEBUG msg="exec phases" sandbox=sb-1 total_ms=2.5 lookup_ms=0.5 agent_ms=1.5
time=x level=DEBUG msg="exec phases" sandbox=sb-2 total_ms=9 agent_ms=9
time=x level=INFO msg="sandbox closed" sandbox=sb-1 total_ms=100
time=x level=DEBUG msg="exec phases" sandbox=sb-1 total_ms=3.5 lookup_ms=bad agent_ms=2.5
`
	got := parsePhases(strings.NewReader(log), "sb-1")
	if got["total"].N != 2 || got["total"].Median != 3 || got["agent"].Median != 2 || got["lookup"].N != 1 {
		t.Errorf("got %+v, want 2 totals (median 3), agent median 2, 1 lookup", got)
	}
	if parsePhases(strings.NewReader(log), "sb-3") != nil {
		t.Error("phases for a sandbox that logged none")
	}
}
