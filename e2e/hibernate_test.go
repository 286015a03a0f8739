package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/errdefs"
)

// counterLoop keeps a counter and a random token in a shell's memory only,
// and reports them to a file each tick; the file is output, not state.
const counterLoop = `tok=$(head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \n'); i=0
while :; do i=$((i+1)); echo "$tok $i" > /tmp/counter.tmp; mv /tmp/counter.tmp /tmp/counter; sleep 0.05; done`

func readCounter(t *testing.T, sb *client.Sandbox) (string, int) {
	t.Helper()
	f := strings.Fields(mustSh(t, sb, "cat /tmp/counter"))
	if len(f) != 2 {
		t.Fatalf("counter file: %q", f)
	}
	n, _ := strconv.Atoi(f[1])
	return f[0], n
}

// waitCounter polls the counter file of a counterLoop in sb until cond
// holds for its value, and returns the token and that value. The loop
// starts (and, after a wake, runs on) when the machine gets round to it:
// the test waits for that, bounded by a generous deadline, never for a
// fixed time.
func waitCounter(t *testing.T, sb *client.Sandbox, what string, cond func(n int) bool) (string, int) {
	t.Helper()
	var tok string
	var n int
	waitFile(t, sb, "/tmp/counter", what, func(s string) bool {
		f := strings.Fields(s)
		if len(f) != 2 {
			return false
		}
		v, err := strconv.Atoi(f[1])
		tok, n = f[0], v
		return err == nil && cond(v)
	})
	return tok, n
}

// waitFile polls the file path in sb until accept takes what it reads
// (trimmed), and returns that, bounded by a generous deadline.
func waitFile(t *testing.T, sb *client.Sandbox, path, what string, accept func(string) bool) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var last string
	for {
		var out strings.Builder
		res, err := sb.Exec(ctx, client.ExecOptions{Shell: "cat " + path + " 2>/dev/null", Stdout: &out})
		if err != nil {
			t.Fatalf("%s: read %s: %v", what, path, err)
		}
		last = strings.TrimSpace(out.String())
		if res.ExitCode == 0 && accept(last) {
			return last
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s: not reached in 3 minutes; %s reads %q", what, path, last)
		case <-time.After(20 * time.Millisecond): // poll interval, not a wait for an outcome
		}
	}
}

func TestHibernateWakeCycles(t *testing.T) {
	ctx := context.Background()
	sb := newSandbox(t, clientOpts())
	if _, err := sb.Start(ctx, client.ExecOptions{Shell: counterLoop}); err != nil {
		t.Fatal(err)
	}
	tok, last := waitCounter(t, sb, "the counter loop has started", func(n int) bool { return n >= 1 })
	for cycle := 1; cycle <= 20; cycle++ {
		mustSh(t, sb, fmt.Sprintf("mkdir -p /root/cycles && echo content-%d > /root/cycles/%d", cycle, cycle))
		_, before := readCounter(t, sb)
		if m := rootfsMounts(sb.ID); len(m) != 1 {
			t.Fatalf("cycle %d: running with rootfs mounts %v, want one", cycle, m)
		}
		if err := sb.Hibernate(ctx); err != nil {
			t.Fatalf("cycle %d: hibernate: %v", cycle, err)
		}
		if sb.Info.State != "hibernated" {
			t.Fatalf("cycle %d: state %q after hibernate", cycle, sb.Info.State)
		}
		if len(runscPids(sb.ID)) != 0 {
			t.Fatalf("cycle %d: a hibernated sandbox still has runtime processes: %v", cycle, runscPids(sb.ID))
		}
		// Nor a bridge port: its veth leaves the bridge, and joins it to wake.
		if v := veths(sb.ID, true); len(v) != 0 {
			t.Fatalf("cycle %d: a hibernated sandbox is still a bridge port: %v", cycle, v)
		}
		// Nor a mount: not its rootfs (park.go), nor its netns (every
		// mount on the host slows each gVisor start, restore and wake).
		if m := rootfsMounts(sb.ID); len(m) != 0 {
			t.Fatalf("cycle %d: a hibernated sandbox's rootfs is mounted: %v", cycle, m)
		}
		if m := mountsAt(filepath.Join(env.runDir, "netns", sb.ID)); len(m) != 0 {
			t.Fatalf("cycle %d: a hibernated sandbox's netns is mounted: %v", cycle, m)
		}
		// The next exec wakes it; every file of every cycle is there.
		out := mustSh(t, sb, "cat /root/cycles/*")
		var want strings.Builder
		for i := 1; i <= cycle; i++ {
			want.WriteString(fmt.Sprintf("content-%d\n", i))
		}
		if cycle >= 10 { // cat sorts 1, 10, 11, ..., 2, 20, 3: compare as sets
			if len(strings.Fields(out)) != cycle {
				t.Fatalf("cycle %d: %d files, want %d: %q", cycle, len(strings.Fields(out)), cycle, out)
			}
		} else if out != want.String() {
			t.Fatalf("cycle %d: files %q, want %q", cycle, out, want.String())
		}
		// The process kept its memory: same token, counter continues.
		gotTok, n := readCounter(t, sb)
		if gotTok != tok || n < before {
			t.Fatalf("cycle %d: counter %s %d after wake, was %s %d: memory lost", cycle, gotTok, n, tok, before)
		}
		if v := veths(sb.ID, true); len(v) != 1 {
			t.Fatalf("cycle %d: woken as bridge ports %v, want one", cycle, v)
		}
		if cycle == 1 {
			checkCgroupLimits(t, sb.ID, 100000, 1024) // its limits again after the wake's restore
		}
		last = n
	}
	// The loop runs on after the last wake: its counter moves past the
	// value read then (a stopped loop fails here at the deadline).
	waitCounter(t, sb, fmt.Sprintf("the counter runs on after the last wake (past %d)", last), func(n int) bool { return n > last })
	evs, _ := sb.Events(ctx)
	hib, woke := 0, 0
	for _, e := range evs {
		switch e.Type {
		case "sandbox.hibernated":
			hib++
		case "sandbox.woken":
			woke++
		}
	}
	if hib != 20 || woke != 20 {
		t.Errorf("ledger: %d hibernated, %d woken; want 20 each", hib, woke)
	}
	if err := sb.Hibernate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := sb.Close(ctx); err != nil {
		t.Fatal(err)
	}
	checkNoLeftovers(t, sb.ID)
}

func TestHibernateNeedsGVisor(t *testing.T) {
	curRuntime = "crun"
	defer func() { curRuntime = "gvisor" }()
	sb := newSandbox(t, clientOpts())
	if err := sb.Hibernate(context.Background()); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "CRIU") {
		t.Errorf("hibernate under crun: got %v, want FailedPrecondition saying why", err)
	}
	mustSh(t, sb, "true")
}

func TestIdleHibernation(t *testing.T) {
	ctx := context.Background()
	withDaemonFlags(t, "--idle-hibernate", "1s")
	sb := newSandbox(t, clientOpts())
	mustSh(t, sb, "echo before-idle > /root/f")
	// A long exec keeps it awake while it runs. Once it has finished the
	// sandbox may hibernate at any moment (1 s idle), so whether it was
	// awake during the exec is read from the ledger, which orders the
	// exec's start and finish and every hibernation, not from a state
	// sampled afterwards.
	if out, _, r := sh(t, sb, "sleep 2; echo done"); r.ExitCode != 0 || out != "done\n" {
		t.Fatalf("long exec: %q %+v", out, r)
	}
	// Then, idle, it hibernates: waited for, bounded by a generous deadline.
	wctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	for sb.Info.State != "hibernated" {
		select {
		case <-wctx.Done():
			t.Fatalf("idle sandbox not hibernated in 3 minutes: %s", sb.Info.State)
		case <-time.After(50 * time.Millisecond): // poll interval
		}
		if err := sb.Refresh(wctx); err != nil && wctx.Err() == nil {
			t.Fatal(err)
		}
	}
	evs, err := sb.Events(ctx)
	if err != nil {
		t.Fatal(err)
	}
	running := map[any]bool{} // execs started and not yet finished
	for _, e := range evs {
		switch e.Type {
		case "exec.started":
			running[e.Data["exec_id"]] = true
		case "exec.finished":
			delete(running, e.Data["exec_id"])
		case "sandbox.hibernated", "sandbox.idle_hibernated":
			if len(running) > 0 {
				t.Fatalf("hibernated while an exec ran: %s at seq %d, execs running %v; ledger %v", e.Type, e.Seq, running, types(evs))
			}
		}
	}
	if out := mustSh(t, sb, "cat /root/f"); out != "before-idle\n" {
		t.Errorf("after waking from idle hibernation: %q", out)
	}
}

// rootfsMounts lists the mountinfo lines of sandbox id's rootfs.
func rootfsMounts(id string) []string {
	return mountsAt(filepath.Join(env.stateDir, "sandboxes", id, "rootfs"))
}

// mountsAt returns the lines of our mountinfo that mount on path.
func mountsAt(path string) []string {
	var found []string
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	at := " " + path + " "
	for _, l := range strings.Split(string(mi), "\n") {
		if strings.Contains(l, at) {
			found = append(found, l)
		}
	}
	return found
}

// TestDaemonKilledMidHibernate: the daemon is SIGKILLed while runsc saves a
// sandbox's memory for a hibernation. Its runsc CLI dies with it, but the
// Sentry finishes the save and exits. The restart's reconcile finds the
// image whole and the sandbox hibernated, and the next exec wakes it as it
// was: before, the sandbox was taken for lost and cleaned up, image and
// files with it.
func TestDaemonKilledMidHibernate(t *testing.T) {
	ctx := context.Background()
	sb := newSandbox(t, gvisorOpts())
	giveState(t, sb)
	killMidCheckpoint(t, sb.ID, func() error { return sb.Hibernate(ctx) })
	if err := sb.Refresh(ctx); err != nil || sb.Info.State != "hibernated" {
		t.Fatalf("after the restart: state %q (%v), want hibernated; the daemon's log of it:\n%s", sb.Info.State, err, daemonLogOf(sb.ID))
	}
	checkState(t, sb, "woken after the crash")
}

// TestDaemonKilledMidLiveCheckpoint: the daemon is SIGKILLed while runsc
// saves a running sandbox for a memory checkpoint. The held checkpoint
// command outlives it: it finishes the save, then starts the sandbox
// again. The restart's reconcile waits for it; before, it resumed the
// sandbox it found paused under the save, which killed it.
func TestDaemonKilledMidLiveCheckpoint(t *testing.T) {
	ctx := context.Background()
	sb := newSandbox(t, gvisorOpts())
	giveState(t, sb)
	killMidCheckpoint(t, sb.ID, func() error { _, err := sb.CheckpointMemory(ctx, "cut"); return err })
	if err := sb.Refresh(ctx); err != nil || sb.Info.State != "running" {
		t.Fatalf("after the restart: state %q (%v), want running; the daemon's log of it:\n%s", sb.Info.State, err, daemonLogOf(sb.ID))
	}
	checkState(t, sb, "after the crash")
}

// giveState gives sb a file, a process and 48 MiB of memory that does not
// compress: a checkpoint of it takes long enough for a kill to land in it.
func giveState(t *testing.T, sb *client.Sandbox) {
	t.Helper()
	mustSh(t, sb, "echo kept > /root/k; head -c 48m /dev/urandom > /dev/shm/big; (sleep 100000 &) ; echo ok")
}

// checkState fails the test unless sb still has what giveState gave it.
func checkState(t *testing.T, sb *client.Sandbox, when string) {
	t.Helper()
	got := mustSh(t, sb, "cat /root/k; wc -c < /dev/shm/big; ps -o args | grep -c '^sleep 100000'")
	if got != "kept\n50331648\n1\n" {
		t.Errorf("%s: %q, want its file, its memory and its process", when, got)
	}
}

// killMidCheckpoint runs op (which checkpoints sandbox id), SIGKILLs the
// daemon as soon as runsc's checkpoint of id is seen running, and starts
// it again. A checkpoint that ends before it is seen (a fast one on a
// quiet host) is logged and the daemon killed all the same: the test then
// checks the aftermath of a kill just after it, which must keep the
// sandbox as well.
func killMidCheckpoint(t *testing.T, id string, op func() error) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- op() }()
	// Polling a condition, with a deadline.
	for deadline := time.Now().Add(time.Minute); !checkpointRunning(id); time.Sleep(200 * time.Microsecond) {
		if len(done) > 0 {
			t.Log("the checkpoint ended before its runsc command was seen: the daemon is killed after it")
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no runsc checkpoint of the sandbox within a minute")
		}
	}
	if err := stopDaemon(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-done
	if err := startDaemon(); err != nil {
		t.Fatal(err)
	}
}

// checkpointRunning reports whether a runsc checkpoint of id runs: a
// process whose arguments hold the verb and end with the id (read from
// /proc here, quicker than a pgrep per look).
func checkpointRunning(id string) bool {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil || len(b) == 0 {
			continue
		}
		args := strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00")
		if args[len(args)-1] == id && slices.Contains(args, "checkpoint") {
			return true
		}
	}
	return false
}

// daemonLogOf returns the daemon log's lines that name id.
func daemonLogOf(id string) string {
	log, _ := os.ReadFile(env.logFile.Name())
	var mine []string
	for _, l := range strings.Split(string(log), "\n") {
		if strings.Contains(l, id) {
			mine = append(mine, l)
		}
	}
	return strings.Join(mine, "\n")
}

// TestWakeAfterReboot: a host's reboot empties the run directory (/run is
// a tmpfs), a hibernated sandbox's netns file (its place) with it. The
// next exec wakes it all the same; before, every wake was NotFound.
func TestWakeAfterReboot(t *testing.T) {
	ctx := context.Background()
	sb := newSandbox(t, gvisorOpts())
	mustSh(t, sb, "echo kept > /root/k")
	if err := sb.Hibernate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := stopDaemon(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(env.runDir, "netns", sb.ID)); err != nil {
		t.Fatal(err)
	}
	if err := startDaemon(); err != nil {
		t.Fatal(err)
	}
	if got := mustSh(t, sb, "cat /root/k"); got != "kept\n" {
		t.Errorf("woken after its netns file went: %q", got)
	}
}

// TestWakeOfBrokenImage: a wake whose restore fails (an image cut short)
// says why and leaves the sandbox hibernated as it was: no container, no
// bridge port, and its rootfs parked, not mounted.
func TestWakeOfBrokenImage(t *testing.T) {
	ctx := context.Background()
	sb := newSandbox(t, gvisorOpts())
	if err := sb.Hibernate(ctx); err != nil {
		t.Fatal(err)
	}
	img := filepath.Join(env.stateDir, "hibernate", sb.ID, "checkpoint.img")
	if err := os.Truncate(img, 100); err != nil {
		t.Fatal(err)
	}
	err := sb.Wake(ctx)
	if err == nil {
		t.Fatal("wake of a cut image succeeded")
	}
	t.Logf("wake: %v", err)
	if err := sb.Refresh(ctx); err != nil || sb.Info.State != "hibernated" {
		t.Errorf("after the failed wake: state %q (%v), want hibernated", sb.Info.State, err)
	}
	if m := rootfsMounts(sb.ID); len(m) != 0 {
		t.Errorf("after the failed wake its rootfs is mounted: %v", m)
	}
	if v := veths(sb.ID, true); len(v) != 0 {
		t.Errorf("after the failed wake it is a bridge port: %v", v)
	}
	if p := runscPids(sb.ID); len(p) != 0 {
		t.Errorf("after the failed wake runtime processes are left: %v", p)
	}
}
