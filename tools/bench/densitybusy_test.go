package main

import (
	"os"
	"testing"
	"time"
)

func TestParseProcStat(t *testing.T) {
	// A comm with spaces and parentheses; utime 1500, stime 250, 7 threads.
	line := "42 (a (b) c) S 1 42 42 0 -1 4194560 100 0 0 0 1500 250 0 0 20 0 7 0 12345 1000000 200 18446744073709551615\n"
	p, ok := parseProcStat(line)
	if !ok || p.comm != "a (b) c" || p.ticks != 1750 || p.threads != 7 {
		t.Errorf("got %+v, %v; want comm %q, 1750 ticks, 7 threads", p, ok, "a (b) c")
	}
	for _, bad := range []string{"", "42 no parens S 1", "42 (x) S 1 2 3"} {
		if _, ok := parseProcStat(bad); ok {
			t.Errorf("%q parsed", bad)
		}
	}
	if got := cpuBusyTicks("cpu  100 5 50 1000 30 2 3 4 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n"); got != 164 {
		t.Errorf("busy ticks %v, want 164 (all but idle and iowait)", got)
	}
}

// TestHostCPUSince: the busiest processes come first, at most hostTopN,
// and a pid reused by another process (another comm) is not counted.
func TestHostCPUSince(t *testing.T) {
	at := time.Unix(1000, 0)
	a := hostSample{at: at, busy: 1000, procs: map[int]procStat{
		1: {"init", 100, 1}, 2: {"kdamond", 50, 1}, 3: {"old", 0, 1}, 4: {"idle", 7, 1},
		5: {"p5", 0, 1}, 6: {"p6", 0, 1}, 7: {"p7", 0, 1}, 8: {"p8", 0, 1},
	}}
	s := hostSample{at: at.Add(2 * time.Second), busy: 1100, procs: map[int]procStat{
		1: {"init", 140, 2}, 2: {"kdamond", 80, 1}, 3: {"new", 500, 1}, 4: {"idle", 7, 1},
		5: {"p5", 2, 1}, 6: {"p6", 4, 1}, 7: {"p7", 6, 1}, 8: {"p8", 8, 1},
	}}
	h := s.since(a)
	if h.WindowS != 2 || h.BusyMSPerS != 500 {
		t.Errorf("window %v s, busy %v ms/s; want 2 s, 500 ms/s (100 ticks over 2 s)", h.WindowS, h.BusyMSPerS)
	}
	want := []string{"init", "kdamond", "p8", "p7", "p6"}
	if len(h.Top) != len(want) {
		t.Fatalf("top %+v, want %v", h.Top, want)
	}
	for i, p := range h.Top {
		if p.Comm != want[i] {
			t.Errorf("top[%d] = %+v, want %s", i, p, want[i])
		}
	}
	if h.Top[0].MSPerS != 200 || h.Top[0].Threads != 2 {
		t.Errorf("init: %+v, want 200 ms/s (40 ticks over 2 s), 2 threads", h.Top[0])
	}
}

// TestSampleHostReadsThisProcess: the sampler finds this process in the
// real /proc, with its comm and threads.
func TestSampleHostReadsThisProcess(t *testing.T) {
	s := sampleHost()
	p, ok := s.procs[os.Getpid()]
	if !ok || p.comm == "" || p.threads < 1 {
		t.Errorf("this process in the sample: %+v, %v", p, ok)
	}
	if s.busy <= 0 {
		t.Errorf("busy ticks %v, want some", s.busy)
	}
}
