package agent

import (
	"os"
	"testing"
	"time"
)

func TestWatchdogKillsOverAllocatingChild(t *testing.T) {
	if _, err := os.Stat("/bin/dd"); err != nil {
		t.Skip("needs /bin/dd")
	}
	c := startServer(t, Config{MemoryLimit: 64 << 20})
	ctx := testCtx(t)
	start := time.Now()
	res, err := c.Exec(ctx, ExecRequest{Argv: []string{"dd", "if=/dev/zero", "of=/dev/null", "bs=300M", "count=1"}}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !res.OOMKilled || res.Signal != "SIGKILL" || res.ExitCode != 137 {
		t.Errorf("got %+v, want oom_killed by SIGKILL", res)
	}
	t.Logf("killed after %v", time.Since(start))
	// The agent survived and still serves; a small exec is left alone.
	res, err = c.Exec(ctx, ExecRequest{Argv: []string{"dd", "if=/dev/zero", "of=/dev/null", "bs=1M", "count=10"}}, nil, nil)
	if err != nil || res.OOMKilled || res.ExitCode != 0 {
		t.Errorf("small exec after the kill: got %+v, %v; want exit 0", res, err)
	}
}

func TestWatchdogAttributesDescendant(t *testing.T) {
	c := startServer(t, Config{MemoryLimit: 64 << 20})
	ctx := testCtx(t)
	// The hog is a grandchild: the shell survives and reports dd's status.
	res, err := c.Exec(ctx, ExecRequest{Shell: "dd if=/dev/zero of=/dev/null bs=300M count=1 2>/dev/null; echo $?"}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !res.OOMKilled || res.ExitCode != 0 {
		t.Errorf("got %+v, want oom_killed with the shell's exit 0", res)
	}
}

func TestReadStat(t *testing.T) {
	st, ok := readStat("/proc/self/stat", make([]byte, 1024))
	if !ok || st.ppid != os.Getppid() || st.rss <= 0 {
		t.Errorf("readStat(self): got %+v, %v; want ppid %d and rss > 0", st, ok, os.Getppid())
	}
}
