package main

import (
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestStats(t *testing.T) {
	tests := []struct {
		name        string
		xs          []float64
		median, p95 float64
	}{
		{"empty", nil, 0, 0},
		{"one", []float64{7}, 7, 7},
		{"two", []float64{4, 2}, 3, 4},
		{"odd unsorted", []float64{5, 1, 3}, 3, 5},
		{"ten", []float64{10, 9, 8, 7, 6, 5, 4, 3, 2, 1}, 5.5, 10},
		{"twenty", seq(1, 20), 10.5, 19},
		{"hundred", seq(1, 100), 50.5, 95},
		{"outlier", []float64{1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1000}, 1, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			in := append([]float64(nil), tc.xs...)
			if got := median(tc.xs); got != tc.median {
				t.Errorf("median(%v) = %v, want %v", tc.xs, got, tc.median)
			}
			if got := p95(tc.xs); got != tc.p95 {
				t.Errorf("p95(%v) = %v, want %v", tc.xs, got, tc.p95)
			}
			for i := range in {
				if in[i] != tc.xs[i] {
					t.Fatalf("input modified: %v, was %v", tc.xs, in)
				}
			}
			s := summarize(tc.xs)
			if s.N != len(tc.xs) || s.Median != tc.median || s.P95 != tc.p95 {
				t.Errorf("summarize(%v) = %+v, want n=%d p50=%v p95=%v", tc.xs, s, len(tc.xs), tc.median, tc.p95)
			}
		})
	}
}

func TestParseSize(t *testing.T) {
	tests := []struct {
		in   string
		want int64
		ok   bool
	}{
		{"1MB", 1_000_000, true},
		{"100MB", 100_000_000, true},
		{"1GB", 1_000_000_000, true},
		{"20KB", 20_000, true},
		{"5", 5, true},
		{"x", 0, false},
		{"-1MB", 0, false},
	}
	for _, tc := range tests {
		got, err := parseSize(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("parseSize(%q) = %d, %v; want %d, ok=%v", tc.in, got, err, tc.want, tc.ok)
		}
	}
}

func seq(a, b int) []float64 {
	var out []float64
	for i := a; i <= b; i++ {
		out = append(out, float64(i))
	}
	return out
}

func TestMemLimit(t *testing.T) {
	for in, want := range map[int64]string{10_000_000: "276Mi", 256_000_000: "745Mi", 1_000_000_000: "2164Mi"} {
		if got := memLimit(in); got != want {
			t.Errorf("memLimit(%d) = %s, want %s", in, got, want)
		}
	}
}

func TestParseFlagsMemory(t *testing.T) {
	o, err := parseFlags([]string{"--quick"})
	if err != nil {
		t.Fatal(err)
	}
	if !o.sections["memory"] || len(o.memSizes) != 1 || o.memSizes[0] != "10MB" || o.memReps != 3 || o.memFanout != 3 {
		t.Errorf("--quick: memory section %v, sizes %v, reps %d, fan-out %d", o.sections["memory"], o.memSizes, o.memReps, o.memFanout)
	}
	if _, err := parseFlags([]string{"--mem-sizes", "x"}); err == nil {
		t.Error("--mem-sizes x: no error")
	}
}

func TestNamesFor(t *testing.T) {
	for _, n := range []int{1, 2, 127, 128, 4194303} {
		h := namesFor(n)
		if len(h.bridge) > 15 || len(h.veth) > 5 {
			t.Errorf("pid %d: bridge %q or veth prefix %q too long", n, h.bridge, h.veth)
		}
		p, err := netip.ParsePrefix(h.subnet)
		if err != nil || p.Bits() != 20 || !netip.MustParsePrefix("10.216.0.0/13").Contains(p.Addr()) {
			t.Errorf("pid %d: subnet %q, want a /20 in 10.216.0.0/13", n, h.subnet)
		}
	}
	if a, b := namesFor(1), namesFor(2); a.subnet == b.subnet || a.bridge == b.bridge || a.table == b.table || a.veth == b.veth {
		t.Errorf("two runs share names: %+v and %+v", a, b)
	}
}

func TestFreeSubnet(t *testing.T) {
	h := namesFor(3) // slot 3: 10.216.48.0/20
	if got := h.freeSubnet(nil); got != "10.216.48.0/20" {
		t.Fatalf("no routes: got %s, want 10.216.48.0/20", got)
	}
	taken := []netip.Prefix{netip.MustParsePrefix("10.216.50.0/24"), netip.MustParsePrefix("10.216.64.0/22")}
	if got := h.freeSubnet(taken); got != "10.216.80.0/20" {
		t.Fatalf("slots 3 and 4 taken: got %s, want 10.216.80.0/20", got)
	}
	if got := namesFor(127).freeSubnet([]netip.Prefix{netip.MustParsePrefix("10.223.240.0/20")}); got != "10.216.0.0/20" {
		t.Fatalf("the last slot taken: got %s, want the first (wrapped)", got)
	}
	// 10,000 sessions need a /18: the one holding slot 3's /20, else the
	// first free after it (routes in the first two here).
	w := h.forAddresses(10_015)
	if w.subnet != "10.216.0.0/18" {
		t.Fatalf("10,015 addresses: got %s, want 10.216.0.0/18", w.subnet)
	}
	if got := w.freeSubnet(taken); got != "10.216.128.0/18" {
		t.Fatalf("/18s with routes in them: got %s, want 10.216.128.0/18", got)
	}
	if got := h.forAddresses(1_010).subnet; got != "10.216.48.0/20" {
		t.Fatalf("1,010 addresses: got %s, want the /20 kept", got)
	}
	if got := h.forAddresses(1_000_000).subnet; got != "10.216.0.0/16" {
		t.Fatalf("a million addresses: got %s, want a /16 at most", got)
	}
}

// TestHostCPUBusy: the host's busy time grows by at least what this process
// burns (/proc/stat counts every CPU's user and system time).
func TestHostCPUBusy(t *testing.T) {
	own := func() time.Duration {
		var ru unix.Rusage
		if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
			t.Fatal(err)
		}
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	before, ownBefore := hostCPUBusy(), own()
	if before <= 0 {
		t.Fatalf("hostCPUBusy() = %v since boot", before)
	}
	x := 0
	for own()-ownBefore < 200*time.Millisecond {
		for i := range 100000 {
			x += i
		}
	}
	if grew := hostCPUBusy() - before; grew < 0.1 {
		t.Fatalf("host busy time grew %.3f s while this process burnt 0.2 s of CPU (%d)", grew, x)
	}
}

// TestLoggedFigures reads the daemon's debug lines the memory section
// takes its figures from: the last matching line of the key wins, a -1
// (not read) throttled time is no figure, and another key's line is not
// taken.
func TestLoggedFigures(t *testing.T) {
	log := filepath.Join(t.TempDir(), "daemon.log")
	lines := `time=1 level=DEBUG msg="memory child started" sandbox=sb-1 checkpoint=ck-1 prepare_ms=7.5 restore_ms=120 agent_ready_ms=31.25 fork_notice_ms=6 hostname_exec=false total_ms=150 cpu_throttled_ms=11.383
time=2 level=DEBUG msg="memory child started" sandbox=sb-2 checkpoint=ck-1 restore_ms=120 total_ms=150 cpu_throttled_ms=-1
time=3 level=DEBUG msg="container restored" runtime=runsc sandbox=sb-1 took=136.230459ms
time=4 level=INFO msg="memory checkpoint" sandbox=sb-0 checkpoint=ck-1 capture_ms=30 source_downtime_ms=40.5
time=5 level=INFO msg="memory checkpoint" sandbox=sb-0 checkpoint=ck-1 capture_ms=30 source_downtime_ms=42
`
	if err := os.WriteFile(log, []byte(lines), 0o644); err != nil {
		t.Fatal(err)
	}
	b := &bench{daemonLog: log}
	var p childPhases
	p.add(b, "sb-1")
	p.add(b, "sb-2")
	p.add(b, "sb-3")
	for _, c := range []struct {
		name string
		got  []float64
		want []float64
	}{
		{"prepare", p.prepare, []float64{7.5}},
		{"agent ready", p.ready, []float64{31.25}},
		{"fork notice", p.notice, []float64{6}},
		{"throttled", p.throttled, []float64{11.383}},
	} {
		if !slices.Equal(c.got, c.want) {
			t.Errorf("%s of sb-1, sb-2 (no split logged, throttled not read) and sb-3 (no line): %v, want sb-1's %v", c.name, c.got, c.want)
		}
	}
	if len(p.restore) != 1 || p.restore[0] < 136.2 || p.restore[0] > 136.3 {
		t.Errorf("runsc restore of sb-1, sb-2 and sb-3: %v, want sb-1's 136.23 alone", p.restore)
	}
	if v, ok := b.loggedDowntime("ck-1"); !ok || v != 42 {
		t.Errorf("downtime ck-1: %v %v, want the last line's 42", v, ok)
	}
}

func TestSelectedMode(t *testing.T) {
	for in, want := range map[string]string{
		"always [madvise] never\n": "madvise",
		"[always] madvise never":   "always",
		"always madvise never":     "",
		"always [madvise never":    "",
		"":                         "",
	} {
		if got := selectedMode(in); got != want {
			t.Errorf("selectedMode(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestDensityLimitHoldsEveryCreate: the throwaway daemon's --max-sandboxes
// counts hibernated sandboxes too, so it must hold the count (or the
// sessions), the fork children and the control's creates, made while all
// of those still count.
func TestDensityLimitHoldsEveryCreate(t *testing.T) {
	for _, o := range []options{
		{sections: map[string]bool{"density": true}, densityCount: 1000},
		{sections: map[string]bool{"density": true}}, // as many as fit, up to densityDefault
		{sections: map[string]bool{"density": true}, densityCount: 50, densitySessions: 1100},
	} {
		n := max(o.densityCount, o.densitySessions)
		if n == 0 {
			n = densityDefault
		}
		if want := n + densityForks + densityControlCreates; o.maxSandboxes() < want {
			t.Errorf("count %d, sessions %d: --max-sandboxes %d, want at least %d", o.densityCount, o.densitySessions, o.maxSandboxes(), want)
		}
	}
}
