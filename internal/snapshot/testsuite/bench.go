package testsuite

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/internal/snapshot"
)

// Size is an amount of data for BenchmarkCommit: Files files of equal size
// adding up to Bytes.
type Size struct {
	Name  string
	Bytes int64
	Files int
}

// Standard sizes for BenchmarkCommit.
var (
	Size1MB   = Size{"1MB", 1 << 20, 16}
	Size100MB = Size{"100MB", 100 << 20, 1000}
	Size1GB   = Size{"1GB", 1 << 30, 50000}
)

// BenchmarkCommit measures one fork step, Commit of an active snapshot
// holding size of data followed by Prepare of a child from it, for each
// size. The data is written once per size, through an overlay mount, outside
// the timer. It reports commit-ms, prepare-ms and remove-ms (the child and
// the committed snapshot, outside the timer) besides ns/op.
func BenchmarkCommit(b *testing.B, open Opener, sizes ...Size) {
	benchmarkCommit(b, open, 0, sizes)
}

// BenchmarkCommitLimit is BenchmarkCommit with disk limits: the source and
// every child are prepared WithDiskLimit(limit).
func BenchmarkCommitLimit(b *testing.B, open Opener, limit int64, sizes ...Size) {
	benchmarkCommit(b, open, limit, sizes)
}

func benchmarkCommit(b *testing.B, open Opener, limit int64, sizes []Size) {
	var opts []snapshot.Opt
	if limit > 0 {
		opts = append(opts, snapshot.WithDiskLimit(limit))
	}
	Require(b, os.Geteuid() == 0, "needs root to mount overlays")
	for _, sz := range sizes {
		b.Run(sz.Name, func(b *testing.B) {
			ctx := context.Background()
			s := open(b, filepath.Join(b.TempDir(), "snapshots"))
			b.Cleanup(func() { _ = s.Close() })
			if err := s.Prepare(ctx, "src", "", opts...); err != nil {
				b.Fatal(err)
			}
			root, unmount := MountRootfs(b, s, "src", []string{b.TempDir()})
			start := time.Now()
			fill(b, root, sz)
			if err := syncfs(root); err != nil {
				b.Fatal(err)
			}
			b.Logf("wrote %s in %d files in %v", sz.Name, sz.Files, time.Since(start).Round(time.Millisecond))
			// The source stays mounted, as a live sandbox would be.
			_ = unmount
			b.Run("commit+prepare", func(b *testing.B) {
				var commit, prepare, remove time.Duration
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					name, key := fmt.Sprintf("c%d", i), fmt.Sprintf("a%d", i)
					t0 := time.Now()
					if err := s.Commit(ctx, name, "src"); err != nil {
						b.Fatal(err)
					}
					t1 := time.Now()
					if err := s.Prepare(ctx, key, name, opts...); err != nil {
						b.Fatal(err)
					}
					commit += t1.Sub(t0)
					prepare += time.Since(t1)
					b.StopTimer()
					t2 := time.Now()
					if err := s.Remove(ctx, key); err != nil {
						b.Fatal(err)
					}
					if err := s.Remove(ctx, name); err != nil {
						b.Fatal(err)
					}
					remove += time.Since(t2)
					b.StartTimer()
				}
				b.ReportMetric(float64(commit.Microseconds())/1000/float64(b.N), "commit-ms")
				b.ReportMetric(float64(prepare.Microseconds())/1000/float64(b.N), "prepare-ms")
				b.ReportMetric(float64(remove.Microseconds())/1000/float64(b.N), "remove-ms")
			})
		})
	}
}

// fill writes sz.Files files adding up to sz.Bytes under root, 500 per
// directory.
func fill(b *testing.B, root string, sz Size) {
	per := sz.Bytes / int64(sz.Files)
	buf := make([]byte, per)
	for i := range buf {
		buf[i] = byte(i*31 + 7)
	}
	for i := 0; i < sz.Files; i++ {
		dir := filepath.Join(root, "data", fmt.Sprintf("d%03d", i/500))
		if i%500 == 0 {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				b.Fatal(err)
			}
		}
		buf[0] = byte(i) // distinct contents
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%05d", i)), buf, 0o644); err != nil {
			b.Fatal(err)
		}
	}
}

func syncfs(path string) error {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Syncfs(fd)
}
