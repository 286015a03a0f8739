package daemon

import (
	"os"
	"strconv"
	"strings"
	"testing"

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
	ha.remove()
	ha.release()
	if ents, _ := os.ReadDir(hostNamesDir); len(ents) != 4 {
		t.Errorf("%d lock files after one daemon's uninstall, want the other's 4", len(ents))
	}
}
