package daemon

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/forkbox/forkbox/errdefs"
)

// Resource defaults and bounds for one sandbox.
const (
	DefaultCPU    = 1.0
	DefaultMemory = 512 << 20
	DefaultPids   = 1024
	minMemory     = 32 << 20
	maxCPU        = 256
)

// ParseCPU parses a CPU quantity in cores: "1", "0.5", "500m".
func ParseCPU(s string) (float64, error) {
	if s == "" {
		return DefaultCPU, nil
	}
	v, err := strconv.ParseFloat(strings.TrimSuffix(s, "m"), 64)
	if err == nil && strings.HasSuffix(s, "m") {
		v /= 1000
	}
	if err != nil || math.IsNaN(v) || v <= 0 || v > maxCPU {
		return 0, fmt.Errorf("cpu %q: want a number of cores such as \"1\", \"0.5\" or \"500m\", above 0 and at most %d: %w", s, maxCPU, errdefs.ErrInvalidArgument)
	}
	return v, nil
}

var memSuffixes = []struct {
	suffix string
	mult   int64
}{
	{"Ki", 1 << 10}, {"Mi", 1 << 20}, {"Gi", 1 << 30}, {"Ti", 1 << 40},
	{"K", 1e3}, {"M", 1e6}, {"G", 1e9}, {"T", 1e12},
}

// ParseMemory parses a memory quantity: bytes, or with a suffix "512Mi",
// "1Gi", "300M".
func ParseMemory(s string) (int64, error) {
	if s == "" {
		return DefaultMemory, nil
	}
	num, mult := s, int64(1)
	for _, m := range memSuffixes {
		if strings.HasSuffix(s, m.suffix) {
			num, mult = strings.TrimSuffix(s, m.suffix), m.mult
			break
		}
	}
	v, err := strconv.ParseFloat(num, 64)
	bad := func() error {
		return fmt.Errorf("memory %q: want bytes or a quantity such as \"512Mi\" or \"2Gi\", at least 32Mi: %w", s, errdefs.ErrInvalidArgument)
	}
	if err != nil || math.IsNaN(v) || v <= 0 || v*float64(mult) > math.MaxInt64/2 {
		return 0, bad()
	}
	b := int64(v * float64(mult))
	if b < minMemory {
		return 0, bad()
	}
	return b, nil
}

// ParsePids checks a process limit (0 = default).
func ParsePids(n int64) (int64, error) {
	switch {
	case n == 0:
		return DefaultPids, nil
	case n < 8 || n > 1<<22:
		return 0, fmt.Errorf("pids %d: want between 8 and %d: %w", n, 1<<22, errdefs.ErrInvalidArgument)
	}
	return n, nil
}
