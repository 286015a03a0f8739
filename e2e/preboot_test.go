package e2e

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/forkbox/forkbox/client"
)

// Pre-booted gVisor sandboxes (serve --preboot): a create or fork child
// takes a sandbox booted ahead of demand and starts its container in it.
// Every test here fails if the pool is bypassed: the sandbox's ledger says
// it was pre-booted, and runsc lists its placeholder container
// (pod-<id>) in the same sandbox process as its own container.

// runscRoot returns the runsc state root of container id: the daemon
// gives each sandbox one (a tenant's is a symlink to its pod's).
func runscRoot(id string) string { return filepath.Join(env.runDir, "runsc", id) }

// runscContainers lists the daemon's runsc containers: id -> sandbox pid,
// from every sandbox's state root (a tenant is listed in its pod's).
func runscContainers(t *testing.T) map[string]string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(env.runDir, "runsc"))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		out, err := exec.Command("runsc", "--root", runscRoot(e.Name()), "list").Output()
		if err != nil {
			t.Fatalf("runsc list: %v", err)
		}
		for _, l := range strings.Split(string(out), "\n")[1:] {
			if f := strings.Fields(l); len(f) >= 3 {
				got[f[0]] = f[1] + " " + f[2]
			}
		}
	}
	return got
}

// spares lists pre-booted sandboxes not handed out: placeholders whose
// sandbox the daemon does not list.
func spares(t *testing.T) []string {
	t.Helper()
	list, err := env.c.ListSandboxes(context.Background(), false)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for id := range runscContainers(t) {
		sb, ok := strings.CutPrefix(id, "pod-")
		if ok && !slices.ContainsFunc(list, func(i *client.Info) bool { return i.Id == sb }) {
			out = append(out, sb)
		}
	}
	slices.Sort(out)
	return out
}

// prebootDaemon restarts the daemon with a pool of n (and metrics, which
// say how many are ready) for the test; it returns the metrics address.
func prebootDaemon(t *testing.T, n int) string {
	t.Helper()
	maddr := freeAddr(t)
	withDaemonFlags(t, "--preboot", strconv.Itoa(n), "--metrics", maddr)
	return maddr
}

// waitReady waits until the daemon says n pre-booted sandboxes are ready
// (forkbox_preboot_ready; a placeholder runsc lists may still be booting)
// and returns those runsc lists as spares.
func waitReady(t *testing.T, maddr string, n int) []string {
	t.Helper()
	return waitGauge(t, maddr, "forkbox_preboot_ready", n, "pre-booted sandboxes")
}

// waitGauge waits until the daemon's gauge says n spares of what are ready,
// and returns the spares runsc lists.
func waitGauge(t *testing.T, maddr, gauge string, n int, what string) []string {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for {
		if scrape(t, "http://"+maddr+"/metrics", "")[gauge] >= float64(n) {
			return spares(t)
		}
		if time.Now().After(deadline) {
			t.Fatalf("fewer than %d %s ready after 3 minutes (spares: %v)", n, what, spares(t))
		}
		time.Sleep(100 * time.Millisecond) // polling a condition, with a deadline
	}
}

// assertPooled fails unless sb runs in a pre-booted sandbox.
func assertPooled(t *testing.T, sb *client.Sandbox) {
	t.Helper()
	evs, err := sb.Events(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) == 0 || evs[0].Type != "sandbox.created" || evs[0].Data["preboot"] != true {
		t.Errorf("sandbox %s: first event %+v, want sandbox.created with preboot=true", sb.ID, evs[0])
	}
	cs := runscContainers(t)
	tenant, pod := cs[sb.ID], cs["pod-"+sb.ID]
	if tenant == "" || pod == "" || strings.Fields(tenant)[0] != strings.Fields(pod)[0] {
		t.Errorf("runsc: container %q and placeholder %q, want both running in one sandbox process", tenant, pod)
	}
}

func prebootOpts() client.CreateOptions {
	return client.CreateOptions{Image: env.image, Runtime: "gvisor"}
}

// TestPrebootCreate: a create takes a pre-booted sandbox, is named and
// addressed as its own, and every operation works on it; close leaves
// nothing.
func TestPrebootCreate(t *testing.T) {
	ctx := context.Background()
	maddr := prebootDaemon(t, 2)
	waitReady(t, maddr, 1)
	before := scrape(t, "http://"+maddr+"/metrics", "")
	o := prebootOpts()
	o.Name, o.Env = "preboot-one", map[string]string{"GREETING": "hi"}
	sb := newSandbox(t, o)
	assertPooled(t, sb)
	checkCPUQuota(t, sb.ID, 100000) // the default limit, after a start that ran with more
	if after := scrape(t, "http://"+maddr+"/metrics", ""); after["forkbox_preboot_hits_total"] != before["forkbox_preboot_hits_total"]+1 {
		t.Errorf("forkbox_preboot_hits_total %v -> %v, want one more", before["forkbox_preboot_hits_total"], after["forkbox_preboot_hits_total"])
	}
	if got := strings.TrimSpace(mustSh(t, sb, "hostname; cat /etc/hostname; echo $GREETING")); got != "preboot-one\npreboot-one\nhi" {
		t.Errorf("hostname, /etc/hostname, env: got %q", got)
	}
	if got := mustSh(t, sb, "ip -4 addr show eth0 | grep -o 'inet [0-9.]*'"); !strings.Contains(got, sb.Info.Ip) {
		t.Errorf("eth0: %q, want the sandbox's address %s", got, sb.Info.Ip)
	}
	// The placeholder is invisible to the tenant.
	if ps := mustSh(t, sb, "ps -o args"); strings.Contains(ps, "hold") {
		t.Errorf("the tenant sees the placeholder:\n%s", ps)
	}
	if err := sb.WriteFile(ctx, "/root/a.txt", []byte("from the parent\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := sb.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	if err := sb.Unpause(ctx); err != nil {
		t.Fatal(err)
	}
	mustSh(t, sb, "true")
	res, err := sb.Fork(ctx, client.ForkOptions{Count: 1})
	if err != nil || res.Children[0].Err != nil {
		t.Fatalf("fork: %v %+v", err, res)
	}
	child := res.Children[0].Sandbox
	t.Cleanup(func() { child.Close(ctx) })
	if got := mustSh(t, child, "cat /root/a.txt; hostname"); got != "from the parent\n"+child.Info.Name+"\n" {
		t.Errorf("child: got %q", got)
	}
	// Full again for the key asked for last: nothing left to boot.
	waitReady(t, maddr, 2)
	if p := scrape(t, "http://"+maddr+"/metrics", "")["forkbox_preboot_pending"]; p != 0 {
		t.Errorf("forkbox_preboot_pending %v with the pool full, want 0", p)
	}
	if err := sb.Close(ctx); err != nil {
		t.Fatal(err)
	}
	checkNoLeftovers(t, sb.ID)
}

// TestPrebootCarriesNothing: a sandbox handed out after another tenant
// used (and closed) a pre-booted sandbox holds nothing of that tenant:
// files, processes, env, hostname, address, credentials. Pre-booted
// sandboxes are never reused, which this checks too.
func TestPrebootCarriesNothing(t *testing.T) {
	ctx := context.Background()
	maddr := prebootDaemon(t, 1)
	waitReady(t, maddr, 1)
	o := prebootOpts()
	o.Name, o.Env = "tenant-a", map[string]string{"SECRET_ENV": "a-env"}
	a := newSandbox(t, o)
	assertPooled(t, a)
	if err := a.Credentials().Set(ctx, "TOKEN_A", "a-credential", client.CredentialOptions{Env: "TOKEN_A", File: "token_a"}); err != nil {
		t.Fatal(err)
	}
	mustSh(t, a, "echo a-file > /root/mark; echo a-tmp > /tmp/mark; (sleep 1000 &) ; echo started")
	aID, aIP := a.ID, a.Info.Ip
	if err := a.Close(ctx); err != nil {
		t.Fatal(err)
	}
	checkNoLeftovers(t, aID)
	waitReady(t, maddr, 1)
	o = prebootOpts()
	o.Name = "tenant-b"
	b := newSandbox(t, o)
	assertPooled(t, b)
	if b.ID == aID {
		t.Fatalf("tenant b got tenant a's sandbox %s", aID)
	}
	out := mustSh(t, b, "ls /root /tmp; ps -o args; env; hostname; ls /run/secrets 2>&1; cat /proc/net/tcp")
	for _, leak := range []string{"mark", "sleep 1000", "a-env", "SECRET_ENV", "tenant-a", "a-credential", "TOKEN_A", "token_a"} {
		if strings.Contains(out, leak) {
			t.Errorf("tenant b sees %q of tenant a:\n%s", leak, out)
		}
	}
	if ip := mustSh(t, b, "ip -4 addr show eth0"); !strings.Contains(ip, b.Info.Ip+"/") || (aIP != b.Info.Ip && strings.Contains(ip, aIP+"/")) {
		t.Errorf("tenant b's eth0 %q, want its own address %s (a had %s)", ip, b.Info.Ip, aIP)
	}
}

// TestPrebootMemory: hibernate/wake and a memory checkpoint (restored in
// place) and a memory fork of a sandbox in a pre-booted sandbox: the
// checkpoint restores both of its containers, placeholder first.
func TestPrebootMemory(t *testing.T) {
	ctx := context.Background()
	maddr := prebootDaemon(t, 1)
	waitReady(t, maddr, 1)
	sb := newSandbox(t, prebootOpts())
	assertPooled(t, sb)
	mustSh(t, sb, "echo kept > /root/k; (while :; do sleep 1; done &) ; echo ok")
	if err := sb.Hibernate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := sb.Wake(ctx); err != nil {
		t.Fatal(err)
	}
	if got := mustSh(t, sb, "cat /root/k; hostname; ps -o args | grep -c 'sleep 1' "); !strings.HasPrefix(got, "kept\n"+sb.Info.Name+"\n") {
		t.Errorf("after wake: %q", got)
	}
	assertPooled(t, sb)
	res, err := sb.Fork(ctx, client.ForkOptions{Count: 1, Memory: true})
	if err != nil || res.Children[0].Err != nil {
		t.Fatalf("memory fork: %v %+v", err, res)
	}
	child := res.Children[0].Sandbox
	t.Cleanup(func() { child.Close(ctx) })
	if got := mustSh(t, child, "cat /root/k; hostname"); got != "kept\n"+child.Info.Name+"\n" {
		t.Errorf("memory child: %q", got)
	}
	mustSh(t, sb, "true")
	for _, s := range []*client.Sandbox{child, sb} {
		id := s.ID
		if err := s.Close(ctx); err != nil {
			t.Fatal(err)
		}
		checkNoLeftovers(t, id)
	}
}

// TestPrebootMemoryCheckpointOutlivesSource: a memory checkpoint of a
// sandbox that ran in a pre-booted sandbox restores after its source is
// closed. The restored placeholder's binds are the child's own: before,
// its /tmp still named the source's placeholder root, shared with it
// while the source lived and gone (runsc's restore failing) once it
// closed.
func TestPrebootMemoryCheckpointOutlivesSource(t *testing.T) {
	ctx := context.Background()
	maddr := prebootDaemon(t, 1)
	waitReady(t, maddr, 1)
	sb := newSandbox(t, prebootOpts())
	assertPooled(t, sb)
	mustSh(t, sb, "echo kept > /root/k; echo tmp > /tmp/t; (while :; do sleep 1; done &) ; echo ok")
	ck, err := sb.CheckpointMemory(ctx, "outlives")
	if err != nil {
		t.Fatal(err)
	}
	src := sb.ID
	if err := sb.Close(ctx); err != nil {
		t.Fatal(err)
	}
	checkNoLeftovers(t, src)
	child, err := env.c.RestoreSnapshot(ctx, ck.Id, client.Overrides{}, nil)
	if err != nil {
		t.Fatalf("restore of a memory checkpoint whose pooled source is closed: %v", err)
	}
	t.Cleanup(func() { child.Close(ctx) })
	got := mustSh(t, child, "cat /root/k /tmp/t; hostname; ps -o args | grep -c '[s]leep 1'")
	if want := "kept\ntmp\n" + child.Info.Name + "\n"; !strings.HasPrefix(got, want) || strings.HasSuffix(got, "\n0\n") {
		t.Errorf("restored child: %q, want %q first, then the source's sleep loop", got, want)
	}
	for _, bundle := range []string{"config.json", "pod/config.json"} {
		b, err := os.ReadFile(filepath.Join(env.stateDir, "sandboxes", child.ID, bundle))
		if err != nil {
			t.Fatal(err)
		}
		var s struct {
			Mounts []struct{ Destination, Source string }
		}
		if err := json.Unmarshal(b, &s); err != nil {
			t.Fatal(err)
		}
		for _, m := range s.Mounts {
			if strings.Contains(m.Source, src) {
				t.Errorf("the child's %s binds %s from the source's %s", bundle, m.Destination, m.Source)
			}
		}
	}
	id := child.ID
	if err := child.Close(ctx); err != nil {
		t.Fatal(err)
	}
	checkNoLeftovers(t, id)
}

// TestPrebootDeadSpare: a pre-booted sandbox that died while it waited
// (killed, or out of memory) is not handed out: the create that would have
// taken it boots its own, and the dead one leaves nothing. Before, that
// create failed.
func TestPrebootDeadSpare(t *testing.T) {
	maddr := prebootDaemon(t, 1)
	spare := waitReady(t, maddr, 1)[0]
	killSandboxProcess(t, "pod-"+spare)
	sb := newSandbox(t, prebootOpts())
	if sb.ID == spare {
		t.Errorf("the create took the dead spare %s", spare)
	}
	mustSh(t, sb, "true")
	checkNoLeftovers(t, spare)
}

// TestPrebootRestart: after a SIGKILL of the daemon, pre-booted sandboxes
// never handed out are destroyed (never handed out after the restart), and
// a sandbox running in one is found again and keeps working.
func TestPrebootRestart(t *testing.T) {
	maddr := prebootDaemon(t, 2)
	waitReady(t, maddr, 1)
	sb := newSandbox(t, prebootOpts())
	assertPooled(t, sb)
	before := waitReady(t, maddr, 2)
	restartDaemon(t, syscall.SIGKILL)
	for _, id := range before {
		if _, err := env.c.Sandbox(context.Background(), id); err == nil {
			t.Errorf("spare %s became a sandbox", id)
		}
	}
	after := waitReady(t, maddr, 2)
	for _, id := range before {
		if slices.Contains(after, id) {
			t.Errorf("spare %s of the killed daemon is still a spare: %v", id, after)
		}
		checkNoLeftovers(t, id)
	}
	mustSh(t, sb, "true")
	assertPooled(t, sb)
}

// waitCreatedReady waits until the daemon says n created members (for
// memory-fork children) are ready, and returns the spares runsc lists.
func waitCreatedReady(t *testing.T, maddr string, n int) []string {
	t.Helper()
	return waitGauge(t, maddr, "forkbox_preboot_created_ready", n, "created pre-booted sandboxes")
}

// memoryChild memory-forks sb into one child, closed at the end of the test.
func memoryChild(t *testing.T, sb *client.Sandbox) *client.Sandbox {
	t.Helper()
	ctx := context.Background()
	res, err := sb.Fork(ctx, client.ForkOptions{Count: 1, Memory: true})
	if err != nil || res.Children[0].Err != nil {
		t.Fatalf("memory fork: %v %+v", err, res)
	}
	child := res.Children[0].Sandbox
	t.Cleanup(func() { child.Close(ctx) })
	return child
}

// prebootKind returns the preboot_kind of sb's sandbox.created event ("":
// it took no pre-booted sandbox).
func prebootKind(t *testing.T, sb *client.Sandbox) string {
	t.Helper()
	evs, err := sb.Events(context.Background())
	if err != nil || len(evs) == 0 || evs[0].Type != "sandbox.created" {
		t.Fatalf("events of %s: %v %+v", sb.ID, err, evs)
	}
	k, _ := evs[0].Data["preboot_kind"].(string)
	return k
}

// TestPrebootMemoryForkCreated: a memory fork child of a source that runs
// in a pre-booted sandbox takes a placeholder created ahead (booted, no
// code run), and the image's placeholder is restored into it. The child
// continues the source's processes with its own name and address and
// nothing of another child; the pool turns to that kind when asked for it;
// after a SIGKILL of the daemon, created spares are destroyed, never
// handed out.
func TestPrebootMemoryForkCreated(t *testing.T) {
	ctx := context.Background()
	maddr := prebootDaemon(t, 1)
	waitReady(t, maddr, 1)
	sb := newSandbox(t, prebootOpts())
	assertPooled(t, sb)
	mustSh(t, sb, "echo kept > /root/k; (while :; do sleep 1; done &) ; echo ok")

	// The pool holds a booted member: the first child finds no created
	// one, restores the ordinary way, and the pool turns to created.
	first := memoryChild(t, sb)
	if k := prebootKind(t, first); k != "" {
		t.Errorf("first memory child: preboot_kind %q, want none (the pool held none created)", k)
	}
	mustSh(t, first, "echo mine > /root/first-child")
	before := scrape(t, "http://"+maddr+"/metrics", "")
	spare := waitCreatedReady(t, maddr, 1)
	if st := runscContainers(t)["pod-"+spare[0]]; !strings.HasSuffix(st, " created") {
		t.Errorf("the spare's placeholder: runsc says %q, want created", st)
	}

	child := memoryChild(t, sb)
	if k := prebootKind(t, child); k != "created" {
		t.Fatalf("second memory child: preboot_kind %q, want created", k)
	}
	if child.ID != spare[0] {
		t.Errorf("the child is %s, the created spare was %s", child.ID, spare[0])
	}
	assertPooled(t, child)
	checkCPUQuota(t, child.ID, 100000) // the default limit, after a restore that ran with more
	if after := scrape(t, "http://"+maddr+"/metrics", ""); after["forkbox_preboot_hits_total"] != before["forkbox_preboot_hits_total"]+1 {
		t.Errorf("forkbox_preboot_hits_total %v -> %v, want one more", before["forkbox_preboot_hits_total"], after["forkbox_preboot_hits_total"])
	}
	got := mustSh(t, child, "cat /root/k; hostname; ls /root; ps -o args | grep -c '[s]leep 1'")
	if want := "kept\n" + child.Info.Name + "\n"; !strings.HasPrefix(got, want) || strings.Contains(got, "first-child") || strings.HasSuffix(got, "\n0\n") {
		t.Errorf("created-member child: %q, want %q first, the source's sleep loop, no other child's file", got, want)
	}
	if ip := mustSh(t, child, "ip -4 addr show eth0"); !strings.Contains(ip, child.Info.Ip+"/") || strings.Contains(ip, sb.Info.Ip+"/") {
		t.Errorf("child's eth0 %q, want its own address %s, not the source's %s", ip, child.Info.Ip, sb.Info.Ip)
	}
	mustSh(t, sb, "true")
	mustSh(t, first, "true")

	// A created spare whose sandbox died while it waited: the child
	// that takes it is restored the ordinary way, in its netns.
	dead := waitCreatedReady(t, maddr, 1)[0]
	killSandboxProcess(t, "pod-"+dead)
	third := memoryChild(t, sb)
	if third.ID != dead || prebootKind(t, third) != "created" {
		t.Errorf("third memory child %s (%s), want the dead spare %s, created", third.ID, prebootKind(t, third), dead)
	}
	if got := mustSh(t, third, "cat /root/k; hostname"); got != "kept\n"+third.Info.Name+"\n" {
		t.Errorf("child of a dead created spare: %q", got)
	}

	// The next created spare is destroyed by a restart, never handed out.
	spares := waitCreatedReady(t, maddr, 1)
	restartDaemon(t, syscall.SIGKILL)
	for _, id := range spares {
		if _, err := env.c.Sandbox(ctx, id); err == nil {
			t.Errorf("spare %s became a sandbox", id)
		}
		checkNoLeftovers(t, id)
	}
	for _, s := range []*client.Sandbox{third, child, first, sb} {
		id := s.ID
		if err := s.Close(ctx); err != nil {
			t.Fatal(err)
		}
		checkNoLeftovers(t, id)
	}
}

// killSandboxProcess SIGKILLs the gVisor sandbox process of runsc container
// id and waits until it is gone.
func killSandboxProcess(t *testing.T, id string) {
	t.Helper()
	out, err := exec.Command("runsc", "--root", runscRoot(id), "state", id).Output()
	if err != nil {
		t.Fatalf("runsc state %s: %v", id, err)
	}
	var st struct{ Pid int }
	if err := json.Unmarshal(out, &st); err != nil || st.Pid <= 0 {
		t.Fatalf("runsc state %s: %v in %q", id, err, out)
	}
	if err := syscall.Kill(st.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); syscall.Kill(st.Pid, 0) == nil; {
		if time.Now().After(deadline) {
			t.Fatalf("sandbox process %d of %s still there 30 s after SIGKILL", st.Pid, id)
		}
		time.Sleep(20 * time.Millisecond) // polling a condition, with a deadline
	}
}
