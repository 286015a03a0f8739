package naive_test

import (
	"context"
	"testing"

	"github.com/forkbox/forkbox/internal/snapshot"
	"github.com/forkbox/forkbox/internal/snapshot/naive"
	"github.com/forkbox/forkbox/internal/snapshot/testsuite"
)

func open(t testing.TB, root string) snapshot.Snapshotter {
	t.Helper()
	s, err := naive.Open(context.Background(), root, nil)
	if err != nil {
		t.Fatalf("naive.Open: %v", err)
	}
	return s
}

func TestConformance(t *testing.T) {
	testsuite.Run(t, open)
}

// BenchmarkCommit: for contrast with btrfs; copies grow with the data.
func BenchmarkCommit(b *testing.B) {
	testsuite.BenchmarkCommit(b, open, testsuite.Size1MB, testsuite.Size100MB)
}
