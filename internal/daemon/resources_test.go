package daemon

import (
	"testing"

	"github.com/forkbox/forkbox/errdefs"
)

func TestParseResources(t *testing.T) {
	cpus := []struct {
		in   string
		want float64
		ok   bool
	}{
		{"", 1, true}, {"1", 1, true}, {"0.5", 0.5, true}, {"500m", 0.5, true}, {"2", 2, true},
		{"0", 0, false}, {"-1", 0, false}, {"abc", 0, false}, {"NaN", 0, false}, {"1000", 0, false},
	}
	for _, c := range cpus {
		got, err := ParseCPU(c.in)
		if c.ok && (err != nil || got != c.want) {
			t.Errorf("ParseCPU(%q) = %v, %v; want %v", c.in, got, err, c.want)
		}
		if !c.ok && !errdefs.IsInvalidArgument(err) {
			t.Errorf("ParseCPU(%q): got %v, want InvalidArgument", c.in, err)
		}
	}
	mems := []struct {
		in   string
		want int64
		ok   bool
	}{
		{"", 512 << 20, true}, {"512Mi", 512 << 20, true}, {"1Gi", 1 << 30, true}, {"100M", 100e6, true},
		{"67108864", 64 << 20, true}, {"1Mi", 0, false}, {"lots", 0, false}, {"-5Gi", 0, false}, {"1e30", 0, false},
	}
	for _, c := range mems {
		got, err := ParseMemory(c.in)
		if c.ok && (err != nil || got != c.want) {
			t.Errorf("ParseMemory(%q) = %v, %v; want %v", c.in, got, err, c.want)
		}
		if !c.ok && !errdefs.IsInvalidArgument(err) {
			t.Errorf("ParseMemory(%q): got %v, want InvalidArgument", c.in, err)
		}
	}
	if _, err := ParsePids(3); !errdefs.IsInvalidArgument(err) {
		t.Errorf("ParsePids(3): got %v, want InvalidArgument", err)
	}
}
