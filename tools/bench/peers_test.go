package main

import (
	"maps"
	"strings"
	"testing"
)

func TestPeerRatios(t *testing.T) {
	rep := &Report{
		Runtimes: []RuntimeResult{
			{Runtime: "gvisor", CreateFirstExec: Summary{N: 1, Median: 150}, ExecTrue: Summary{N: 1, Median: 10}},
			{Runtime: "crun", CreateFirstExec: Summary{N: 1, Median: 50}, ExecTrue: Summary{N: 1, Median: 0}},
		},
		Forks: []ForkResult{
			{Runtime: "gvisor", Size: "1MB", ForkWall: Summary{N: 1, Median: 200}},
			{Runtime: "gvisor", Size: "1GB", ForkWall: Summary{N: 1, Median: 400}}, // no peer of this size
		},
	}
	p := PeerResult{CreateFirstExec: Summary{N: 1, Median: 300}, ExecTrue: Summary{N: 1, Median: 100},
		Forks: []PeerFork{{Size: "1MB", ForkWall: Summary{N: 1, Median: 1000}}}}
	p.setRatios(rep)
	got := map[string]float64{}
	for _, r := range p.Ratios {
		got[r.What+"/"+r.Runtime] = r.Ratio
	}
	want := map[string]float64{
		"create + first exec/gvisor":      0.5,
		"exec true/gvisor":                0.1,
		"create + first exec/crun":        50.0 / 300,
		"fork to child ready, 1MB/gvisor": 0.2,
	}
	if len(got) != len(want) { // crun's exec of 0 ms and the 1GB fork have no ratio
		t.Errorf("ratios %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("ratio %s = %v, want %v", k, got[k], v)
		}
	}
}

func TestPeerFlags(t *testing.T) {
	o, err := parseFlags([]string{"--peers", "--peer-fork-reps", "2"})
	if err != nil || !o.peers || o.peerRuntime != "runc" || o.peerForkReps != 2 {
		t.Fatalf("parseFlags = %+v, %v", o, err)
	}
	for _, args := range [][]string{{"--peers", "--peer-fork-reps", "0"}, {"--peers", "--peer-runtime", "docker"}} {
		if _, err := parseFlags(args); err == nil || !strings.Contains(err.Error(), "peer") {
			t.Errorf("parseFlags(%v) = %v, want a refusal naming the peer flag", args, err)
		}
	}
}

func TestIssueTargets(t *testing.T) {
	rep := &Report{Runtimes: []RuntimeResult{
		{Runtime: "gvisor", CreateFirstExec: Summary{N: 1, Median: 79}, ExecTrue: Summary{N: 9, Median: 2, P95: 7}},
		{Runtime: "crun", CreateFirstExec: Summary{N: 1, Median: 40}, ExecTrue: Summary{N: 9, Median: 1.5, P95: 2}},
	}, Forks: []ForkResult{{Runtime: "gvisor", Size: "1GB", Capture: Summary{N: 1, Median: 5}, ForkWall: Summary{N: 1, Median: 81}}},
		Fanouts: []FanoutResult{{Runtime: "gvisor", Count: 100, TotalMS: 9_999}},
		Memory: []MemoryResult{
			{Size: "10MB", ChildStart: Summary{N: 5, Median: 121}},
			{Size: "256MB", ChildStart: Summary{N: 5, Median: 140}, ForkDowntime: Summary{N: 5, Median: 75},
				Fanout: &MemFanout{Count: 10, TotalMS: 3_800, PageFloor: &PageFloor{FloorMS: 5_600}}},
		}}
	met := map[string]bool{}
	floors := map[string]float64{}
	for _, tg := range rep.targets() {
		met[tg.What] = tg.Met
		if tg.HostFloorMS != 0 {
			floors[tg.What] = tg.HostFloorMS
		}
	}
	// Only the fan-out has a floor, its page floor.
	if want := map[string]float64{"gVisor fan-out of 10 children, total (256MB resident)": 5_600}; !maps.Equal(floors, want) {
		t.Errorf("host floors %v, want %v", floors, want)
	}
	want := map[string]bool{
		"gVisor create + first exec p50":                     true,
		"gVisor exec true p50":                               true,
		"gvisor exec true p95 within 3x p50":                 false,
		"crun exec true p50":                                 false,
		"crun exec true p95 within 3x p50":                   true,
		"gVisor fork-to-child-ready p50 1GB (call to ready)": false,
		"100 gVisor children (TotalMS)":                      true,
		// issue 17's, the same as the memory table's
		"gVisor memory-fork child start p50 (10MB resident)":           false,
		"gVisor memory-fork child start p50 (256MB resident)":          true,
		"gVisor fan-out of 10 children, total (256MB resident)":        false,
		"gVisor source downtime of a memory fork p50 (256MB resident)": true,
	}
	if len(met) != 12 {
		t.Errorf("%d targets, want 12: %v", len(met), met)
	}
	for k, v := range want {
		if got, ok := met[k]; !ok || got != v {
			t.Errorf("target %q: met=%v (present %v), want %v; all: %v", k, got, ok, v, met)
		}
	}
}
