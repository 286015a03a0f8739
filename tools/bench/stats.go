package main

import (
	"math"
	"sort"
)

// Summary is the distribution of one measured quantity, in milliseconds.
type Summary struct {
	N      int     `json:"n"`
	Median float64 `json:"p50_ms"`
	P95    float64 `json:"p95_ms"`
	Min    float64 `json:"min_ms"`
	Max    float64 `json:"max_ms"`
}

// median returns the middle of xs (the mean of the two middles for an even
// count); 0 for no samples. xs is not modified.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := sorted(xs)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// percentile returns the nearest-rank p-th percentile (0 < p <= 100) of xs;
// 0 for no samples. xs is not modified.
func percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := sorted(xs)
	rank := int(math.Ceil(p / 100 * float64(len(s))))
	rank = min(max(rank, 1), len(s))
	return s[rank-1]
}

// p95 is the nearest-rank 95th percentile of xs.
func p95(xs []float64) float64 { return percentile(xs, 95) }

func sorted(xs []float64) []float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	return s
}

// summarize describes xs.
func summarize(xs []float64) Summary {
	if len(xs) == 0 {
		return Summary{}
	}
	s := sorted(xs)
	return Summary{N: len(s), Median: median(s), P95: p95(s), Min: s[0], Max: s[len(s)-1]}
}

// ratio is a/b, or 0 when b is 0.
func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}
