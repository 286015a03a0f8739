// Start benchmarks: Run-to-running and Delete for each runtime, and the
// floor: a bare namespaced start of the same rootfs.
//
//	go test -run '^$' -bench Start -benchtime 20x ./internal/runtime/testsuite/

package testsuite_test

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/forkbox/forkbox/internal/runtime"
	"github.com/forkbox/forkbox/internal/runtime/crun"
	"github.com/forkbox/forkbox/internal/runtime/runsc"
	"github.com/forkbox/forkbox/internal/runtime/spec"
	"github.com/forkbox/forkbox/internal/runtime/testsuite"
)

func BenchmarkStart(b *testing.B) {
	b.Run("runsc", func(b *testing.B) {
		testsuite.RequireRoot(b, "runsc")
		rt, err := runsc.New(runsc.Options{Root: filepath.Join(b.TempDir(), "state")})
		if err != nil {
			b.Fatal(err)
		}
		benchRuntime(b, rt)
	})
	b.Run("crun", func(b *testing.B) {
		testsuite.RequireRoot(b, "crun")
		rt, err := crun.New(crun.Options{Root: filepath.Join(b.TempDir(), "state")})
		if err != nil {
			b.Fatal(err)
		}
		benchRuntime(b, rt, crun.Adapt)
	})
	b.Run("floor", benchFloor)
}

// benchRuntime times Run (until running) and Delete --force of a busybox
// container whose init sleeps, and reports the medians.
func benchRuntime(b *testing.B, rt runtime.Runtime, hooks ...func(*specs.Spec)) {
	f := testsuite.NewFixture(b, rt, spec.SpecOptions{Args: []string{"/bin/sleep", "1000"}, MemoryBytes: 256 << 20, Pids: 1000}, hooks...)
	ctx := context.Background()
	var runs, dels []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		id := fmt.Sprintf("%s-%d", f.ID, i)
		t0 := time.Now()
		if err := rt.Run(ctx, id, f.Bundle); err != nil {
			b.Fatalf("run: %v", err)
		}
		t1 := time.Now()
		if err := rt.Delete(ctx, id, true); err != nil {
			b.Fatalf("delete: %v", err)
		}
		runs, dels = append(runs, t1.Sub(t0)), append(dels, time.Since(t1))
	}
	b.StopTimer()
	b.ReportMetric(median(runs), "run-ms/p50")
	b.ReportMetric(median(dels), "delete-ms/p50")
}

// benchFloor clones into new mount, pid, uts, ipc and net namespaces,
// chroots into the rootfs and runs /bin/true there: what any container
// start costs at least.
func benchFloor(b *testing.B) {
	testsuite.RequireRoot(b, "")
	rootfs := filepath.Join(b.TempDir(), "rootfs")
	testsuite.BusyboxRootfs(b, rootfs)
	var runs []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		cmd := exec.Command("/bin/true")
		cmd.SysProcAttr = &syscall.SysProcAttr{
			Cloneflags: syscall.CLONE_NEWNS | syscall.CLONE_NEWPID | syscall.CLONE_NEWUTS | syscall.CLONE_NEWIPC | syscall.CLONE_NEWNET,
			Chroot:     rootfs,
		}
		if err := cmd.Run(); err != nil {
			b.Fatalf("floor start: %v", err)
		}
		runs = append(runs, time.Since(t0))
	}
	b.StopTimer()
	b.ReportMetric(median(runs), "run-ms/p50")
}

func median(ds []time.Duration) float64 {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return float64(s[len(s)/2].Microseconds()) / 1000
}
