// Memory-fork tests: a counter process in a source sandbox continues in two
// containers restored from one checkpoint image (each with its own copy of
// the rootfs at another host path, in its own netns), the children
// diverge, and the source itself is restored from the same image.

package runsc

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/forkbox/forkbox/internal/runtime/spec"
)

// mfBox is one container of a memory-fork test: its own bundle dir (etc
// files, config.json, stdio.log) beside a rootfs dir.
type mfBox struct {
	id, bundle, rootfs, netns, hostname string
}

// mfBundle writes a bundle for rootfs (which must exist) with args, the
// given hostname and netns, and registers the container's deletion.
func mfBundle(t *testing.T, rt *Runsc, dir, rootfs, hostname, netnsPath string, args []string) *mfBox {
	t.Helper()
	b := &mfBox{id: randID("fbxmf-"), bundle: filepath.Join(dir, "bundle"), rootfs: rootfs, netns: netnsPath, hostname: hostname}
	mounts, err := spec.WriteEtcFiles(b.bundle, spec.EtcFiles{Hostname: hostname})
	if err != nil {
		t.Fatal(err)
	}
	if err := spec.PrepareRootfs(rootfs); err != nil {
		t.Fatal(err)
	}
	s, err := spec.NewSpec(spec.SpecOptions{
		Rootfs: rootfs, Hostname: hostname, Args: args, NetNSPath: netnsPath,
		CgroupsPath: "/forkbox-test/" + b.id, Mounts: mounts,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := spec.WriteBundle(b.bundle, s); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mfDelete(t, rt, b.id) })
	return b
}

func mfDelete(t *testing.T, rt *Runsc, id string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := rt.Delete(ctx, id, true); err != nil {
		t.Errorf("cleanup delete %s: %v", id, err)
	}
	for _, c := range cgroupControllers {
		os.Remove(filepath.Join("/sys/fs/cgroup", c, "forkbox-test", id))
		os.Remove(filepath.Join("/sys/fs/cgroup", c, "forkbox-test"))
	}
}

// copyTree copies src to dst with cp -a (the test's stand-in for a btrfs
// snapshot of the source's upper).
func copyTree(t *testing.T, src, dst string) {
	t.Helper()
	if out, err := exec.Command("cp", "-a", src, dst).CombinedOutput(); err != nil {
		t.Fatalf("cp -a %s %s: %v: %s", src, dst, err, out)
	}
}

// lastInt returns the last integer line of path (0 if none).
func lastInt(path string) int {
	b, _ := os.ReadFile(path)
	lines := strings.Fields(string(b))
	for i := len(lines) - 1; i >= 0; i-- {
		if n, err := strconv.Atoi(strings.TrimPrefix(lines[i], "tick=")); err == nil {
			return n
		}
	}
	return 0
}
