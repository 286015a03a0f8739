package clustertest

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/forkbox/forkbox/internal/network"
)

// Leaks lists what of the cluster is still on the host: mounts and loop
// devices of its directory, processes started from it, its network
// namespaces, host links, cgroups, the namespaces' forwarding records,
// and the directory itself. After Close it must be empty (Close audits
// the records before it deletes the namespaces).
func (c *Cluster) Leaks() []string {
	return append(c.leaks(), c.recordLeaks()...)
}

// leaks is Leaks but for the forwarding records.
func (c *Cluster) leaks() []string {
	var found []string
	dir := c.Dir
	if dir != "" {
		mi, _ := os.ReadFile("/proc/self/mountinfo")
		for _, l := range strings.Split(string(mi), "\n") {
			if strings.Contains(l, dir) {
				found = append(found, "mount: "+l)
			}
		}
		files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
		for _, f := range files {
			if b, _ := os.ReadFile(f); strings.HasPrefix(string(b), dir) {
				found = append(found, "loop device: "+filepath.Base(filepath.Dir(filepath.Dir(f)))+" on "+strings.TrimSpace(string(b)))
			}
		}
		procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
		self := "/proc/" + strconv.Itoa(os.Getpid()) + "/cmdline"
		for _, p := range procs {
			if b, _ := os.ReadFile(p); p != self && strings.Contains(string(b), dir) {
				found = append(found, "process "+filepath.Base(filepath.Dir(p))+": "+strings.ReplaceAll(string(b), "\x00", " "))
			}
		}
		if _, err := os.Lstat(dir); err == nil {
			found = append(found, "directory: "+dir)
		}
	}
	if c.RunID == "" {
		return found
	}
	nss, _ := filepath.Glob("/run/netns/fbn" + c.RunID + "-*")
	for _, ns := range nss {
		found = append(found, "netns: "+ns)
	}
	links, _ := filepath.Glob("/sys/class/net/fbh" + c.RunID + "*")
	for _, l := range links {
		found = append(found, "link: "+filepath.Base(l))
	}
	cgs, _ := filepath.Glob("/sys/fs/cgroup/*/forkbox-cl-" + c.RunID + "-*")
	cgs2, _ := filepath.Glob("/sys/fs/cgroup/forkbox-cl-" + c.RunID + "-*")
	for _, cg := range append(cgs, cgs2...) {
		found = append(found, "cgroup: "+cg)
	}
	return found
}

// recordLeaks are the nodes' namespaces' forwarding records still there:
// meaningful only while the namespaces stand (their names are inodes).
func (c *Cluster) recordLeaks() []string {
	var found []string
	for _, n := range c.Nodes {
		if n.nsRecord != "" {
			p := filepath.Join(network.ForwardRecordDir(), n.nsRecord)
			if _, err := os.Lstat(p); err == nil {
				found = append(found, "forwarding record: "+p)
			}
		}
	}
	return found
}
