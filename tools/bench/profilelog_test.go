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
time=x level=DEBUG msg="exec phases" sandbox=sb-10 total_ms=50 agent_ms=50
time=x level=DEBUG msg="create phases" sandbox=sb-1 total_ms=70 run_ms=40
time=x level=DEBUG msg="create phases" sandbox=sb-4 total_ms=90 run_ms=60
`
	got := parsePhases(strings.NewReader(log), daemonExecPhases, "sb-1")
	if got["total"].N != 2 || got["total"].Median != 3 || got["agent"].Median != 2 || got["lookup"].N != 1 {
		t.Errorf("got %+v, want 2 totals (median 3), agent median 2, 1 lookup", got)
	}
	if parsePhases(strings.NewReader(log), daemonExecPhases, "sb-3") != nil {
		t.Error("phases for a sandbox that logged none")
	}
	if c := parsePhases(strings.NewReader(log), daemonCreatePhases, ""); c["total"].N != 2 || c["run"].Median != 50 || c["agent"].N != 0 {
		t.Errorf("create phases of any sandbox: got %+v, want 2 totals, run median 50, no agent", c)
	}
}
