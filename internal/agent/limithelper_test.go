package agent

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// Execs started at once under a pids limit each get the limit and keep
// their exit codes, signals and timeouts: the helper's execve is invisible
// to the command (same pid, argv, env).
func TestLimitHelperConcurrentExecs(t *testing.T) {
	c := startServer(t, Config{PidsLimit: 41})
	ctx := testCtx(t)
	const n = 16
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var out bytes.Buffer
			res, err := c.Exec(ctx, ExecRequest{Argv: []string{"/bin/sh", "-c",
				`grep 'Max processes' /proc/self/limits; echo "$0 $1 $X"; exit $((X % 7))`, "zero", "one"},
				Env: map[string]string{"X": fmt.Sprint(i)}}, &out, nil)
			if err != nil {
				errs <- err
				return
			}
			s := out.String()
			if f := strings.Fields(s); res.ExitCode != i%7 || len(f) < 4 || f[2] != "41" || f[3] != "41" ||
				!strings.Contains(s, fmt.Sprintf("zero one %d\n", i)) {
				errs <- fmt.Errorf("exec %d: got %+v, output %q; want exit %d, limit 41, argv and env kept", i, res, s, i%7)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	res, err := c.Exec(ctx, ExecRequest{Shell: "sleep 30", Timeout: 200 * time.Millisecond}, nil, nil)
	if err != nil || !res.TimedOut || res.Signal != "SIGKILL" {
		t.Errorf("timed-out exec under the pids limit: got %+v, %v; want timed out by SIGKILL", res, err)
	}
	res, err = c.Exec(ctx, ExecRequest{Shell: "kill -TERM $$"}, nil, nil)
	if err != nil || res.Signal != "SIGTERM" {
		t.Errorf("self-killed exec: got %+v, %v; want SIGTERM", res, err)
	}
}

// A command cannot reach the helper: it does not inherit its descriptor,
// and the helper cannot be rewritten (sealed) even through the agent's own.
func TestLimitHelperUnreachable(t *testing.T) {
	s, c := startServerWith(t, Config{PidsLimit: 41})
	if s.limiter == nil {
		t.Fatal("no native helper on amd64")
	}
	var out bytes.Buffer
	res, err := c.Exec(testCtx(t), ExecRequest{Shell: "ls -l /proc/self/fd/"}, &out, nil)
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("exec: %+v, %v", res, err)
	}
	if strings.Contains(out.String(), "memfd") || strings.Contains(out.String(), "forkbox-limit") {
		t.Errorf("the command holds the helper's descriptor: %q", out.String())
	}
	f, err := os.OpenFile(s.limiter.path, os.O_WRONLY, 0)
	if err == nil {
		_, err = f.Write([]byte{0x90})
		f.Close()
	}
	if err == nil {
		t.Error("wrote to the sealed helper")
	}
}

// The helper is a valid ELF whose limit is where its code loads it from.
func TestLimitHelperELF(t *testing.T) {
	b := limitHelperELF(1234)
	if got, want := len(b), elfHeaderLen+progHeaderLen+len(limitHelperCode); got != want {
		t.Fatalf("size: got %d, want %d", got, want)
	}
	if !bytes.HasPrefix(b, []byte{0x7f, 'E', 'L', 'F', 2, 1}) {
		t.Errorf("header: got % x", b[:6])
	}
	// mov rax, [rip+0x4b] at offset 0x0e (7 bytes) reads code offset 0x60.
	if got := b[len(b)-8]; got != 1234%256 || 0x0e+7+0x4b != len(limitHelperCode)-8 {
		t.Errorf("limit: got byte %d at the end, rip-relative target %#x, want %#x", got, 0x0e+7+0x4b, len(limitHelperCode)-8)
	}
}
