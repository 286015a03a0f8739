package controller

import (
	"k8s.io/apimachinery/pkg/api/equality"
)

// equalStatus reports whether two statuses are the same (semantically:
// quantities and times by value), so unchanged ones are not written.
func equalStatus[T any](a, b T) bool { return equality.Semantic.DeepEqual(a, b) }
