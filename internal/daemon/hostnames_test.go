package daemon

import (
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/errdefs"
)

// TestHostNames: a daemon holds its host-wide names; a second one naming
// any of them is refused with FailedPrecondition naming the flag and the
// holder's pid; other names are free; a release frees them.
func TestHostNames(t *testing.T) {
	old := hostNamesDir
	hostNamesDir = t.TempDir()
	t.Cleanup(func() { hostNamesDir = old })
	a := Config{CgroupParent: "fbx-test/a", Bridge: "fbxta", NetTable: "fbxta", VethPrefix: "fta"}
	ha, err := lockHostNames(a)
	if err != nil {
		t.Fatal(err)
	}
	for flag, cfg := range map[string]Config{
		"--cgroup-parent": {CgroupParent: a.CgroupParent, Bridge: "fbxtb", NetTable: "fbxtb", VethPrefix: "ftb"},
		"--bridge":        {CgroupParent: "fbx-test/b", Bridge: a.Bridge, NetTable: "fbxtb", VethPrefix: "ftb"},
		"--net-table":     {CgroupParent: "fbx-test/b", Bridge: "fbxtb", NetTable: a.NetTable, VethPrefix: "ftb"},
		"--veth-prefix":   {CgroupParent: "fbx-test/b", Bridge: "fbxtb", NetTable: "fbxtb", VethPrefix: a.VethPrefix},
	} {
		_, err := lockHostNames(cfg)
		if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), flag+" ") || !strings.Contains(err.Error(), "pid "+strconv.Itoa(os.Getpid())) {
			t.Errorf("same %s: got %v, want FailedPrecondition naming it and pid %d", flag, err, os.Getpid())
		}
	}
	// In another network namespace (a cluster test's node), the network's
	// names are free; the cgroup parent is not.
	if os.Geteuid() == 0 {
		type result struct {
			same, other error
		}
		ch := make(chan result)
		go func() {
			runtime.LockOSThread() // not unlocked: the thread ends with the goroutine
			if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
				ch <- result{same: err}
				return
			}
			_, same := lockHostNames(a)
			h, other := lockHostNames(Config{CgroupParent: "fbx-test/n", Bridge: a.Bridge, NetTable: a.NetTable, VethPrefix: a.VethPrefix})
			h.release()
			ch <- result{same, other}
		}()
		r := <-ch
		if !errdefs.IsFailedPrecondition(r.same) || !strings.Contains(r.same.Error(), "--cgroup-parent ") {
			t.Errorf("same names in another netns: got %v, want the cgroup parent refused", r.same)
		}
		if r.other != nil {
			t.Errorf("the network's names in another netns: %v", r.other)
		}
	}
	b := Config{CgroupParent: "fbx-test/b", Bridge: "fbxtb", NetTable: "fbxtb", VethPrefix: "ftb"}
	hb, err := lockHostNames(b)
	if err != nil {
		t.Fatalf("other names: %v", err)
	}
	hb.release()
	ha.release()
	if ha, err = lockHostNames(a); err != nil {
		t.Fatalf("after a release: %v", err)
	}
	var files []string
	for _, f := range ha.files {
		files = append(files, f.Name())
	}
	ha.release()
	for _, f := range files {
		if _, err := os.Stat(f); !os.IsNotExist(err) {
			t.Errorf("lock file %s after its daemon let go: %v", f, err)
		}
	}
}

// TestHostNameLockRace: holders remove their lock file as they let go, and
// lockName makes that safe: many takers of one name at once (each open
// file description is its own flock owner, in one process as in many)
// never hold it two at a time. Without lockName's check, a taker that
// opened the file before its holder removed it locks the removed file
// while the next locks a new one.
func TestHostNameLockRace(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bridge=x")
	var holders, most atomic.Int32
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 2000 {
				f, err := lockName(path)
				if errors.Is(err, unix.EWOULDBLOCK) {
					continue
				}
				if err != nil {
					t.Error(err)
					return
				}
				n := holders.Add(1)
				for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
				}
				holders.Add(-1)
				h := &hostNames{files: []*os.File{f}}
				h.release()
			}
		}()
	}
	wg.Wait()
	if m := most.Load(); m != 1 {
		t.Errorf("at most %d holders at once, want 1", m)
	}
}
