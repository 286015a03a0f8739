package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
)

// leftovers lists what of sandbox id is still on the host: mounts, runtime
// processes, cgroups, netns, veths, writable layers, bundle directories,
// runtime logs.
func leftovers(id string) []string {
	var found []string
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	for _, l := range strings.Split(string(mi), "\n") {
		if strings.Contains(l, id) {
			found = append(found, "mount: "+l)
		}
	}
	if out, _ := exec.Command("pgrep", "-af", id).Output(); len(out) > 0 {
		for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			if !strings.Contains(l, "pgrep") {
				found = append(found, "process: "+l)
			}
		}
	}
	cgs, _ := filepath.Glob("/sys/fs/cgroup/*/" + cgroupParent + "/" + id)
	for _, cg := range cgs {
		found = append(found, "cgroup: "+cg)
	}
	if _, err := os.Stat("/sys/fs/cgroup/" + cgroupParent + "/" + id); err == nil {
		found = append(found, "cgroup: /sys/fs/cgroup/"+cgroupParent+"/"+id)
	}
	for _, p := range []string{
		filepath.Join(env.runDir, "netns", id),
		filepath.Join(env.stateDir, "sandboxes", id),
		filepath.Join(env.stateDir, "snapshots", "active", id),
		filepath.Join(env.runDir, "runsc", id),
		filepath.Join(env.stateDir, "logs", id+".log"),
		filepath.Join(env.stateDir, "logs", "pod-"+id+".log"),
	} {
		if _, err := os.Lstat(p); err == nil {
			found = append(found, "path: "+p)
		}
	}
	return append(found, veths(id, false)...)
}

// veths lists the host veths of sandbox id ("veth: name" each); with
// ports, only those that are a bridge's ports.
func veths(id string, ports bool) []string {
	var found []string
	links, _ := netlink.LinkList()
	for _, l := range links {
		if l.Attrs().Alias == "forkbox:"+id && (!ports || l.Attrs().MasterIndex != 0) {
			found = append(found, "veth: "+l.Attrs().Name)
		}
	}
	return found
}

// checkNoLeftovers fails the test if anything of sandbox id is left.
func checkNoLeftovers(t *testing.T, id string) {
	t.Helper()
	if l := leftovers(id); len(l) > 0 {
		t.Errorf("sandbox %s left behind:\n  %s", id, strings.Join(l, "\n  "))
	}
}

// TestLeftoversDetectsLiveSandbox checks the checker itself: a live sandbox
// must show up in each category it owns.
func TestLeftoversDetectsLiveSandbox(t *testing.T) {
	sb := newSandbox(t, clientOpts())
	l := strings.Join(leftovers(sb.ID), "\n")
	for _, want := range []string{"mount: ", "process: ", "cgroup: ", "veth: ", "path: "} {
		if !strings.Contains(l, want) {
			t.Errorf("leftovers of a live sandbox has no %q entry; got:\n%s", want, l)
		}
	}
}
