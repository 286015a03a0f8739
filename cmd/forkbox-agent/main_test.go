package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/forkbox/forkbox/internal/agent"
	"github.com/forkbox/forkbox/internal/freeport"
)

func need(t *testing.T, ok bool, why string) {
	t.Helper()
	if ok {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatal(why)
	}
	t.Skip(why)
}

// buildAgent builds the static agent binary into a temp dir.
func buildAgent(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "forkbox-agent")
	cmd := exec.Command("go", "build", "-ldflags=-s -w", "-o", bin, ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	return bin
}

// freePort is a loopback address for the agent to listen on (below the
// ephemeral range: see freeport).
func freePort(t *testing.T) string {
	a, err := freeport.Loopback()
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// TestInitInPIDNamespace runs the built agent as PID 1 of a new PID
// namespace (host network) and checks that it serves, reaps orphans and
// exits on SIGTERM after forwarding it.
func TestInitInPIDNamespace(t *testing.T) {
	_, err := exec.LookPath("unshare")
	need(t, err == nil && os.Geteuid() == 0, "needs root and unshare(1)")
	bin := buildAgent(t)
	addr := freePort(t)
	cmd := exec.Command("unshare", "--pid", "--uts", "--fork", "--mount", "--mount-proc", bin, "init")
	cmd.Env = append(os.Environ(), agent.EnvAddr+"="+addr, agent.EnvToken+"=tok", agent.EnvMemoryLimit+"=67108864")
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c := agent.NewClient(addr, "tok")
	if err := agent.WaitReady(ctx, c); err != nil {
		t.Fatal(err)
	}
	// A fork notice: new token, new hostname (set by init in its own UTS
	// namespace); the old token is refused, the rest keeps working on the new.
	reply, err := c.Forked(ctx, agent.ForkNotice{Token: "tok2", Reason: agent.ForkReasonFork,
		Hostname: "forked-child", ParentID: "p", MachineID: "m", Time: time.Now()})
	if err != nil {
		t.Fatalf("forked: %v", err)
	}
	t.Logf("fork reply: %+v", reply)
	if info, err := c.Ping(ctx); err != nil || info.Hostname != "forked-child" {
		t.Errorf("ping after fork: got %+v, %v; want hostname forked-child", info, err)
	}
	if _, err := agent.NewClient(addr, "tok").Ping(ctx); err == nil {
		t.Errorf("the old token still works after the fork notice")
	}
	var out strings.Builder
	res, err := c.Exec(ctx, agent.ExecRequest{Shell: "echo $$ $PPID; cat /proc/1/oom_score_adj /proc/self/oom_score_adj; env | grep -c FORKBOX_; sleep 0.1 &"}, &out, nil)
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("exec: %+v, %v", res, err)
	}
	f := strings.Fields(out.String())
	wantAdj := "-1000"
	if !hasCapSysResource() {
		wantAdj = "0" // cannot lower oom_score_adj without CAP_SYS_RESOURCE
		t.Log("no CAP_SYS_RESOURCE: the agent's oom_score_adj stays 0")
	}
	if len(f) != 5 || f[1] != "1" || f[2] != wantAdj || f[3] != "0" || f[4] != "0" {
		t.Errorf("got %q, want: ppid 1, agent oom_score_adj -1000, user 0, no FORKBOX_ vars", out.String())
	}
	// The orphaned sleep is reparented to the agent, which must reap it:
	// polled until the agent has no child left (its exit has no event
	// here), a zombie still there at the deadline fails.
	agentPid := childOf(cmd.Process.Pid)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		n, z := childrenOf(agentPid)
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("the agent (host pid %d) still has %d children, %d of them zombies, 30 s after its exec ended", agentPid, n, z)
			break
		}
	}
	// The watchdog kills an over-allocating process, the agent survives.
	res, err = c.Exec(ctx, agent.ExecRequest{Argv: []string{"dd", "if=/dev/zero", "of=/dev/null", "bs=300M", "count=1"}}, nil, nil)
	if err != nil || !res.OOMKilled {
		t.Errorf("dd under a 64 MiB limit: got %+v, %v; want oom_killed", res, err)
	}
	if _, err := c.Ping(ctx); err != nil {
		t.Fatalf("agent died: %v", err)
	}
	// SIGTERM: forwarded to a running exec, then the agent exits.
	pid, err := c.Start(ctx, agent.ExecRequest{Shell: "trap 'exit 0' TERM; while :; do sleep 0.05; done"})
	if err != nil || pid <= 0 {
		t.Fatalf("start: %d, %v", pid, err)
	}
	start := time.Now()
	syscall.Kill(agentPid, syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("agent exit: %v", err)
		}
		if d := time.Since(start); d >= 5*time.Second {
			t.Errorf("agent took %v to exit: it waited out its 5 s grace, though its exec ended on the forwarded SIGTERM", d)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("agent did not exit on SIGTERM")
	}
}

// childOf returns the first child pid of pid.
func childOf(pid int) int {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	n, _ := strconv.Atoi(f[0])
	return n
}

// childrenOf counts the processes whose parent is pid, and the zombies
// among them.
func childrenOf(pid int) (all, zombies int) {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(f) > 2 && f[1] == strconv.Itoa(pid) {
			all++
			if f[0] == "Z" {
				zombies++
			}
		}
	}
	return all, zombies
}

// hasCapSysResource reports whether this process has CAP_SYS_RESOURCE (24),
// needed to lower oom_score_adj.
func hasCapSysResource() bool {
	b, _ := os.ReadFile("/proc/self/status")
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "CapEff:"); ok {
			n, _ := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			return n&(1<<24) != 0
		}
	}
	return false
}
