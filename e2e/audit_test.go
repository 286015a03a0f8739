package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/forkbox/forkbox/client"
)

// The leak audit of the whole run: after anything (a crash and a restart,
// a load run), what the daemon's store says and what is on the host must
// agree. Every sandbox the store calls live is there and usable; every
// trace on the host (mount, process, cgroup, netns, veth, nftables element,
// btrfs subvolume, directory, hibernation image, loop device) belongs to a
// live sandbox.

var sandboxIDRE = regexp.MustCompile(`sb-[0-9a-f]{12}`)

// hostSandboxIDs returns the id of every sandbox with a trace of any kind on
// the host, and traces that name no sandbox but should not be there.
func hostSandboxIDs(t *testing.T) (ids map[string][]string, stray []string) {
	t.Helper()
	ids = map[string][]string{}
	add := func(id, what string) { ids[id] = append(ids[id], what) }
	for _, dir := range []string{
		filepath.Join(env.runDir, "netns"),
		filepath.Join(env.stateDir, "sandboxes"),
		filepath.Join(env.stateDir, "snapshots", "active"),
		filepath.Join(env.runDir, "runsc"),
		filepath.Join(env.runDir, "crun"),
		filepath.Join(env.stateDir, "hibernate"), // memory images: secrets at rest
	} {
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			if id := sandboxIDRE.FindString(e.Name()); id != "" {
				add(id, "path: "+filepath.Join(dir, e.Name()))
			}
		}
	}
	if ents, _ := os.ReadDir(filepath.Join(env.stateDir, "snapshots", "tmp")); len(ents) > 0 {
		for _, e := range ents {
			stray = append(stray, "unfinished snapshot: "+filepath.Join(env.stateDir, "snapshots", "tmp", e.Name()))
		}
	}
	for _, cg := range cgroupDirs() {
		if id := sandboxIDRE.FindString(filepath.Base(cg)); id != "" {
			add(id, "cgroup: "+cg)
		}
	}
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	for _, l := range strings.Split(string(mi), "\n") {
		if strings.Contains(l, env.dir) {
			if id := sandboxIDRE.FindString(l); id != "" {
				add(id, "mount: "+l)
			}
		}
	}
	if out, _ := exec.Command("pgrep", "-af", env.dir).Output(); len(out) > 0 {
		for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			if strings.Contains(l, "pgrep") || strings.Contains(l, " serve ") || daemonStandby(l) {
				continue
			}
			if id := sandboxIDRE.FindString(l); id != "" {
				add(id, "process: "+l)
			} else {
				stray = append(stray, "process: "+l)
			}
		}
	}
	links, _ := netlink.LinkList()
	veths := map[string]bool{}
	for _, l := range links {
		a := l.Attrs()
		if !strings.HasPrefix(a.Name, vethPrefix) {
			continue
		}
		veths[a.Name] = true
		if id, ok := strings.CutPrefix(a.Alias, "forkbox:"); ok {
			add(id, "veth: "+a.Name)
		} else {
			stray = append(stray, "veth without a sandbox alias: "+a.Name)
		}
	}
	// nftables: every port element names a veth that exists.
	portIPs := map[string]bool{}
	if out, err := exec.Command("nft", "list", "table", "bridge", netTable).Output(); err == nil {
		for _, name := range regexp.MustCompile(`"(`+regexp.QuoteMeta(vethPrefix)+`[^"]*)"`).FindAllStringSubmatch(string(out), -1) {
			if !veths[name[1]] && !strings.HasSuffix(name[1], "*") { // "prefix*" is the rules' wildcard
				stray = append(stray, "nftables element for a missing port: "+name[1])
			}
		}
		for _, m := range regexp.MustCompile(`" \. (\d+\.\d+\.\d+\.\d+)`).FindAllStringSubmatch(string(out), -1) {
			portIPs[m[1]] = true
		}
	}
	// ... and every egress policy chain (eg-<address in hex>) a registered port.
	if out, err := exec.Command("nft", "list", "table", "inet", netTable).Output(); err == nil {
		for _, m := range regexp.MustCompile(`chain eg-([0-9a-f]{8}) `).FindAllStringSubmatch(string(out), -1) {
			var a [4]byte
			fmt.Sscanf(m[1], "%02x%02x%02x%02x", &a[0], &a[1], &a[2], &a[3])
			if ip := fmt.Sprintf("%d.%d.%d.%d", a[0], a[1], a[2], a[3]); !portIPs[ip] {
				stray = append(stray, "nftables egress chain of an address with no port: "+ip)
			}
		}
	}
	// ... and every blackhole route in the subnet (a hibernated sandbox's
	// address, kept off the bridge) a registered port.
	if out, err := exec.Command("ip", "-4", "route", "show", "type", "blackhole").Output(); err == nil {
		sn := netip.MustParsePrefix(subnet)
		for _, f := range strings.Fields(string(out)) {
			if a, err := netip.ParseAddr(strings.TrimSuffix(f, "/32")); err == nil && sn.Contains(a) && !portIPs[a.String()] {
				stray = append(stray, "blackhole route to an address with no port: "+a.String())
			}
		}
	}
	// Loop devices: the daemon's one btrfs image, nothing else of this run.
	backing, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	var loops []string
	for _, b := range backing {
		if f, err := os.ReadFile(b); err == nil && strings.Contains(string(f), env.dir) {
			loops = append(loops, strings.TrimSpace(string(f)))
		}
	}
	if len(loops) > 1 {
		stray = append(stray, "loop devices: "+strings.Join(loops, ", "))
	}
	return ids, stray
}

// audit checks the store against the host (see above) and returns the
// sandboxes the store says are live.
func audit(t *testing.T) []*client.Info {
	t.Helper()
	ctx := context.Background()
	all, err := listSettled(ctx)
	if err != nil {
		t.Fatalf("audit: list: %v", err)
	}
	live := map[string]*client.Info{}
	var liveList []*client.Info
	for _, s := range all {
		if s.State != "closed" {
			live[s.Id] = s
			liveList = append(liveList, s)
		}
	}
	for _, s := range liveList {
		sb, err := env.c.Sandbox(ctx, s.Id)
		if err != nil {
			t.Errorf("audit: live sandbox %s: %v", s.Id, err)
			continue
		}
		switch s.State {
		case "running":
		case "hibernated":
			if err := sb.Wake(ctx); err != nil {
				t.Errorf("audit: hibernated sandbox %s does not wake: %v", s.Id, err)
				continue
			}
		case "paused":
			if err := sb.Unpause(ctx); err != nil {
				t.Errorf("audit: paused sandbox %s does not unpause: %v", s.Id, err)
				continue
			}
		default:
			t.Errorf("audit: sandbox %s is %q after a restart (%s); want running, paused or hibernated", s.Id, s.State, s.Error)
			continue
		}
		var out strings.Builder
		if res, err := sb.Exec(ctx, client.ExecOptions{Shell: "echo ok", Stdout: &out}); err != nil || res.ExitCode != 0 || out.String() != "ok\n" {
			procs, _ := exec.Command("pgrep", "-af", s.Id).Output()
			neigh, _ := exec.Command("ip", "neigh", "show", s.Ip).Output()
			t.Errorf("audit: live sandbox %s (%s, %s, %s) is not usable: %v %+v %q\n  its processes:\n%s  neighbour entry: %s  cgroup: %s",
				s.Id, s.State, s.Runtime, s.Ip, err, res, out.String(), procs, neigh, cgroupCounters(s.Id))
			logs, _ := filepath.Glob(filepath.Join(env.stateDir, "logs", s.Id+"*"))
			for _, l := range logs {
				b, _ := os.ReadFile(l)
				t.Logf("audit: the end of %s:\n%s", l, tail(b, 3000))
			}
		}
		if _, err := os.Stat(filepath.Join(env.runDir, "netns", s.Id)); err != nil {
			t.Errorf("audit: live sandbox %s has no netns: %v", s.Id, err)
		}
	}
	ids, stray := hostSandboxIDs(t)
	var orphans []string
	for id, traces := range ids {
		if live[id] == nil {
			sort.Strings(traces)
			orphans = append(orphans, id+":\n    "+strings.Join(traces, "\n    "))
		}
	}
	sort.Strings(orphans)
	if len(orphans) > 0 {
		t.Errorf("audit: traces of sandboxes that are not live:\n  %s", strings.Join(orphans, "\n  "))
	}
	if len(stray) > 0 {
		t.Errorf("audit: stray host state:\n  %s", strings.Join(stray, "\n  "))
	}
	// The ledger agrees: a closed sandbox's ledger says so.
	for _, s := range all {
		if s.State != "closed" {
			continue
		}
		evs, err := env.c.Events(ctx, s.Id)
		if err != nil {
			t.Errorf("audit: events of %s: %v", s.Id, err)
			continue
		}
		if !hasEvent(evs, "sandbox.closed") {
			t.Errorf("audit: closed sandbox %s has no sandbox.closed in its ledger: %v", s.Id, types(evs))
		}
	}
	return liveList
}

// closeAllLive closes every live sandbox and checks that nothing of any
// sandbox is left on the host.
func closeAllLive(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	list, err := env.c.ListSandboxes(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range list {
		if sb, err := env.c.Sandbox(ctx, s.Id); err == nil {
			if err := sb.Close(ctx); err != nil {
				t.Errorf("close %s (%s): %v", s.Id, s.State, err)
			}
		}
	}
	ids, stray := hostSandboxIDs(t)
	for id, traces := range ids {
		t.Errorf("after closing everything, %s left:\n    %s", id, strings.Join(traces, "\n    "))
	}
	if len(stray) > 0 {
		t.Errorf("after closing everything, stray host state:\n  %s", strings.Join(stray, "\n  "))
	}
}

// cgroupCounters returns the limit counters of sandbox id's host cgroup
// (cgroup v1): what was hit, for a diagnosis.
func cgroupCounters(id string) string {
	var b strings.Builder
	for _, f := range []string{"pids/%s/pids.max", "pids/%s/pids.current", "pids/%s/pids.events",
		"memory/%s/memory.limit_in_bytes", "memory/%s/memory.max_usage_in_bytes", "memory/%s/memory.failcnt", "memory/%s/memory.oom_control"} {
		p := filepath.Join("/sys/fs/cgroup", strings.Replace(f, "%s", filepath.Join(cgroupParent, id), 1))
		v, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		b.WriteString(filepath.Base(p) + "=" + strings.Join(strings.Fields(string(v)), " ") + "; ")
	}
	return b.String()
}

// listSettled lists every sandbox once none is degraded. A sandbox whose
// agent was slow to answer right after a restart (a loaded host) is kept as
// degraded until the daemon's recheck (every 30 s) finds it healthy or gone:
// the audit waits for that condition, within a generous deadline, and then
// judges whatever state it sees.
func listSettled(ctx context.Context) ([]*client.Info, error) {
	deadline := time.Now().Add(3 * time.Minute)
	for {
		all, err := env.c.ListSandboxes(ctx, true)
		if err != nil {
			return nil, err
		}
		degraded := false
		for _, s := range all {
			degraded = degraded || s.State == "degraded"
		}
		if !degraded || time.Now().After(deadline) {
			return all, nil
		}
		select {
		case <-ctx.Done():
			return all, nil
		case <-time.After(time.Second):
		}
	}
}

// daemonStandby reports whether a `pgrep -af` line is one of the daemon's
// standby runsc processes, waiting for a command (README "Standby runsc
// processes"): the daemon's child, whose command line is the bare path of
// the runsc it runs, here the daemon's copy in its run directory (README
// "runsc on huge pages"). They are the daemon's, as long as it lives.
func daemonStandby(line string) bool {
	pid, cmd, _ := strings.Cut(line, " ")
	if env.daemon == nil || cmd != filepath.Join(env.runDir, "runsc-bin", "runsc") {
		return false
	}
	f := procStat(pid)
	return len(f) > 1 && f[1] == strconv.Itoa(env.daemon.Process.Pid)
}

// procStat returns the fields of /proc/<pid>/stat after the command's
// closing parenthesis (state, ppid, ...; proc(5)), nil when pid is gone.
func procStat(pid string) []string {
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return nil
	}
	_, rest, ok := strings.Cut(string(b), ") ")
	if !ok {
		return nil
	}
	return strings.Fields(rest)
}
