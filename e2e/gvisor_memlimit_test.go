package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/internal/runtime/runsc"
)

// sentryEnforcesMemory reports whether the suite's runsc (FORKBOX_E2E_RUNSC,
// else the one on PATH) is built with scripts/gvisor/memory-limit.patch:
// the annotation it reads is in the binary (a stock runsc has no such
// string).
var sentryEnforcesMemory = sync.OnceValue(func() bool {
	bin := os.Getenv("FORKBOX_E2E_RUNSC")
	if bin == "" {
		bin, _ = exec.LookPath("runsc")
	}
	b, err := os.ReadFile(bin)
	return err == nil && bytes.Contains(b, []byte(runsc.AnnotationAppMemoryLimit))
})

// TestGVisorSentryMemoryLimit: with a runsc built with
// scripts/gvisor/memory-limit.patch, a gVisor sandbox's memory limit holds
// exactly against the fastest allocations (a mapping of twice the limit
// touched page by page, and one read(2) of twice the limit that the sentry
// copies into a fresh buffer): the allocation is refused where it is made,
// the sentry's OOM killer SIGKILLs the allocator (its kernel log names the
// pid), the exec reports oom_killed, the host cgroup never holds more than
// the limit above what the sandbox held before, and the sandbox lives on.
// After a memory fork the child's limit counts the memory it was restored
// with. Not the agent's watchdog (its agent logs memory_enforcer=sentry):
// that is left, polling every 250 ms, for shared memory, which the
// sentry charges but does not refuse, and which it kills too.
func TestGVisorSentryMemoryLimit(t *testing.T) {
	if !sentryEnforcesMemory() {
		if os.Getenv("CI") == "true" {
			t.Fatal("runsc without scripts/gvisor/memory-limit.patch: scripts/setup.sh builds it unless FORKBOX_RUNSC_PATCHED=0")
		}
		t.Skip("runsc without scripts/gvisor/memory-limit.patch (run scripts/setup.sh, or set FORKBOX_E2E_RUNSC)")
	}
	ctx := context.Background()
	const limit = 64 << 20
	o := clientOpts()
	o.Runtime = "gvisor"
	o.Resources.Memory = "64Mi"
	sb := newSandbox(t, o)
	// The sentry enforces the limit: the kills of private memory below are
	// its own (its kernel log names them), the watchdog only a backstop.
	if b, _ := os.ReadFile(filepath.Join(env.stateDir, "sandboxes", sb.ID, "stdio.log")); !bytes.Contains(b, []byte("memory_enforcer=sentry")) {
		t.Errorf("the agent does not say the sentry enforces the limit:\n%s", b)
	}
	installProbe(t, sb)
	dir := filepath.Join("/sys/fs/cgroup/memory", cgroupParent, sb.ID)
	for _, shape := range []struct{ name, cmd string }{
		{"mmap", "/root/probe alloc 128"},
		{"read", "dd if=/dev/zero of=/dev/null bs=128M count=1"},
	} {
		base := readInt(filepath.Join(dir, "memory.usage_in_bytes"))
		_ = os.WriteFile(filepath.Join(dir, "memory.max_usage_in_bytes"), []byte("0"), 0)
		execOOM(t, sb, shape.name, shape.cmd)
		if peak := readInt(filepath.Join(dir, "memory.max_usage_in_bytes")); peak-base > limit {
			t.Errorf("%s: the host cgroup went from %d to %d bytes, more than the %d limit", shape.name, base, peak, limit)
		}
	}

	// Shared memory (a MAP_SHARED anonymous mapping, a tmpfs file to
	// gVisor) is charged but not refused by the sentry: the agent's
	// watchdog, polling more slowly beside the sentry, kills it long before
	// the host backstop (64 MiB × 1.5 + 512 MiB), where the whole sandbox
	// would go.
	if out, _, res := sh(t, sb, "exec /root/probe shared 1000"); !res.OOMKilled || res.Signal != "SIGKILL" {
		t.Errorf("1000 MiB of shared memory under 64Mi: %+v, output %q; want killed with oom_killed", res, out)
	}
	if got := mustSh(t, sb, "echo alive"); got != "alive\n" {
		t.Errorf("after the shared memory: the sandbox answered %q", got)
	}

	// A memory fork: the child is restored holding the source's memory,
	// which its limit must count. The holder takes about 32 MiB (gVisor
	// allocates up to 2 MiB per fault: the Go runtime's scattered pages
	// count in full) and the agent about 20: 24 MiB more must not fit, and
	// the OOM killer kills one of the two (the larger, as Linux would).
	// Were the restored memory not counted, it would all fit.
	holder, err := sb.Start(ctx, client.ExecOptions{Shell: "/root/probe hold 16"})
	if err != nil {
		t.Fatal(err)
	}
	waitRSS(t, sb, holder, 16<<10)
	fr, err := sb.Fork(ctx, client.ForkOptions{Memory: true})
	if err != nil {
		t.Fatal(err)
	}
	kids := fr.Sandboxes()
	closeAll(t, kids)
	if len(kids) != 1 {
		t.Fatalf("memory fork: %d children", len(kids))
	}
	kid := kids[0]
	before := strings.Count(mustSh(t, kid, "dmesg"), "out of memory: Killed process")
	out, _, res := sh(t, kid, "/root/probe alloc 24")
	log := mustSh(t, kid, "dmesg")
	if after := strings.Count(log, "out of memory: Killed process"); after != before+1 {
		t.Errorf("after a memory fork: 24 MiB more (exit %d, signal %q, output %q) made %d OOM kills, want 1:\n%s", res.ExitCode, res.Signal, out, after-before, log)
	}
	if got := mustSh(t, kid, "echo alive"); got != "alive\n" {
		t.Errorf("after a memory fork: the sandbox answered %q", got)
	}
}

// execOOM runs cmd (exec'd by a shell that prints its pid first), which
// must be killed by the sentry's OOM killer, and checks that the sandbox
// still serves an exec.
func execOOM(t *testing.T, sb *client.Sandbox, what, cmd string) {
	t.Helper()
	ctx := context.Background()
	var out strings.Builder
	res, err := sb.Exec(ctx, client.ExecOptions{Shell: "echo $$; exec " + cmd, Stdout: &out, Stderr: &out, Timeout: time.Minute})
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	first, _, _ := strings.Cut(out.String(), "\n")
	pid, err := strconv.Atoi(first)
	if err != nil {
		t.Fatalf("%s: output %q, want the pid first", what, out.String())
	}
	if !res.OOMKilled || res.Signal != "SIGKILL" {
		t.Errorf("%s: %+v, output %q; want killed with SIGKILL and oom_killed", what, res, out.String())
	}
	log := mustSh(t, sb, "dmesg")
	if want := fmt.Sprintf("out of memory: Killed process %d (", pid); !strings.Contains(log, want) {
		t.Errorf("%s: the kernel log does not name pid %d as killed by the sentry:\n%s", what, pid, log)
	}
	if got := mustSh(t, sb, "echo alive"); got != "alive\n" {
		t.Errorf("%s: the sandbox answered %q", what, got)
	}
}

// waitRSS waits until pid in sb has at least kb KiB resident.
func waitRSS(t *testing.T, sb *client.Sandbox, pid int, kb int64) {
	t.Helper()
	cmd := fmt.Sprintf("awk '/^VmRSS/ {print $2}' /proc/%d/status", pid)
	deadline := time.Now().Add(time.Minute)
	for {
		out, _, _ := sh(t, sb, cmd)
		if v, err := strconv.ParseInt(strings.TrimSpace(out), 10, 64); err == nil && v >= kb {
			return
		}
		if time.Now().After(deadline) {
			ps, _, _ := sh(t, sb, "ps -o pid,rss,args; dmesg | tail -3")
			t.Fatalf("pid %d never held %d KiB (VmRSS %q):\n%s", pid, kb, out, ps)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
