package e2e

import (
	"bufio"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// The reliability battery (hostile_*_test.go, chaos_test.go, load_test.go)
// runs in a bounded form by default, inside `make test`, and in a long form
// with FORKBOX_RELIABILITY=full (`make reliability`).

// reliabilityFull reports whether the long form was asked for.
func reliabilityFull() bool { return os.Getenv("FORKBOX_RELIABILITY") == "full" }

// scaled returns bounded, or full in the long form.
func scaled(bounded, full int) int {
	if reliabilityFull() {
		return full
	}
	return bounded
}

// envInt returns the integer in the environment variable name, or def.
func envInt(t *testing.T, name string, def int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		t.Fatalf("%s=%q: not an integer", name, v)
	}
	return n
}

var probeBuild struct {
	once sync.Once
	path string
	err  error
}

// probeBinary builds the hostile-tenant probe (e2e/probe), static, once.
func probeBinary(t *testing.T) string {
	t.Helper()
	probeBuild.once.Do(func() {
		probeBuild.path = filepath.Join(env.dir, "probe")
		cmd := exec.Command("go", "build", "-o", probeBuild.path, "./probe")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			probeBuild.err = fmt.Errorf("build probe: %v\n%s", err, out)
		}
	})
	if probeBuild.err != nil {
		t.Fatal(probeBuild.err)
	}
	return probeBuild.path
}

// procStatus returns the kB value of field (VmRSS, VmHWM) of pid.
func procStatus(t *testing.T, pid int, field string) int64 {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if v, ok := strings.CutPrefix(s.Text(), field+":"); ok {
			n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return n
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

// countingWriter counts what is written to it.
type countingWriter struct{ n atomic.Int64 }

func (w *countingWriter) Write(p []byte) (int, error) { w.n.Add(int64(len(p))); return len(p), nil }

// hostStateBytes sums the regular files of this run's daemon state that are
// not sandbox data or images: logs, bundles, runtime state, the database.
func hostStateBytes(t *testing.T) int64 {
	t.Helper()
	skip := map[string]bool{filepath.Join(env.stateDir, "snapshots"): true, filepath.Join(env.stateDir, "images"): true}
	var total int64
	for _, root := range []string{env.stateDir, env.runDir} {
		filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return nil
			}
			if d.IsDir() && (skip[p] || d.Name() == "rootfs") { // sandbox files, not host state
				return filepath.SkipDir
			}
			if d.Type().IsRegular() && !strings.HasSuffix(p, ".img") { // the btrfs loop image is sandbox data
				if info, err := d.Info(); err == nil {
					total += info.Size()
				}
			}
			return nil
		})
	}
	return total
}
