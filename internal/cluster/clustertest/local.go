package clustertest

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// CgroupParent is the cgroup the node's sandboxes get theirs under.
func (n *Node) CgroupParent() string { return n.cgroup }

// SandboxPids are the host PIDs in local sandbox id's cgroup (its
// runtime's and its tenant's processes), sorted.
func (n *Node) SandboxPids(id string) []int {
	seen := map[int]bool{}
	files, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", n.cgroup, id, "cgroup.procs"))
	v2, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", n.cgroup, id, "cgroup.procs"))
	for _, f := range append(files, v2...) {
		b, _ := os.ReadFile(f)
		for _, s := range strings.Fields(string(b)) {
			if p, err := strconv.Atoi(s); err == nil {
				seen[p] = true
			}
		}
	}
	out := make([]int, 0, len(seen))
	for p := range seen {
		out = append(out, p)
	}
	slices.Sort(out)
	return out
}

// Leftovers lists what of local sandbox id is still on the node's host:
// mounts, processes, cgroups, its netns file, its writable layer, bundle
// and runtime state.
func (n *Node) Leftovers(id string) []string {
	var found []string
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	for _, l := range strings.Split(string(mi), "\n") {
		if strings.Contains(l, id) {
			found = append(found, "mount: "+l)
		}
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		if b, _ := os.ReadFile(p); strings.Contains(string(b), id) {
			found = append(found, "process "+filepath.Base(filepath.Dir(p))+": "+strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
	cgs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", n.cgroup, id))
	v2, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", n.cgroup, id))
	for _, cg := range append(cgs, v2...) {
		found = append(found, "cgroup: "+cg)
	}
	if out, err := exec.Command("ip", "-n", n.NetNS, "-o", "link", "show").Output(); err == nil {
		for _, l := range strings.Split(string(out), "\n") {
			if strings.Contains(l, "alias forkbox:"+id) {
				found = append(found, "veth in "+n.NetNS+": "+l)
			}
		}
	}
	for _, p := range []string{
		filepath.Join(n.RunDir, "netns", id),
		filepath.Join(n.StateDir, "sandboxes", id),
		filepath.Join(n.StateDir, "snapshots", "active", id),
		filepath.Join(n.RunDir, "runsc", id),
		filepath.Join(n.RunDir, "crun", id),
	} {
		if _, err := os.Lstat(p); err == nil {
			found = append(found, "path: "+p)
		}
	}
	return found
}
