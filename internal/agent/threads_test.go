package agent

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// After ReserveThreads(n), n goroutines blocked in syscalls at once need no
// new thread: the runtime has them idle. Without it, a fresh process makes
// one for each blocked goroutine beyond its idle ones. It runs in a child
// process: this one's threads are whatever earlier tests left.
func TestReserveThreads(t *testing.T) {
	const n = 6
	if os.Getenv("FORKBOX_TEST_RESERVE") != "" {
		reserve := os.Getenv("FORKBOX_TEST_RESERVE") == "reserve"
		before := threadCount()
		var err error
		if reserve {
			_, err = ReserveThreads(n)
		}
		reserved := threadCount()
		blocked, berr := blockAtOnce(n)
		fmt.Printf("before=%d reserved=%d blocked=%d err=%v/%v\n", before, reserved, blocked, err, berr)
		return
	}
	run := func(mode string) (before, reserved, blocked int) {
		t.Helper()
		cmd := exec.Command(os.Args[0], "-test.run=^TestReserveThreads$", "-test.count=1")
		cmd.Env = append(os.Environ(), "FORKBOX_TEST_RESERVE="+mode)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("child: %v: %s", err, out)
		}
		var errText string
		line := strings.SplitN(string(out), "\n", 2)[0]
		if _, err := fmt.Sscanf(line, "before=%d reserved=%d blocked=%d err=%s", &before, &reserved, &blocked, &errText); err != nil {
			t.Fatalf("child printed %q: %v", out, err)
		}
		if errText != "<nil>/<nil>" {
			t.Fatalf("child (%s): %s", mode, errText)
		}
		return before, reserved, blocked
	}
	before, reserved, blocked := run("reserve")
	if reserved < n+2 || blocked > reserved {
		t.Errorf("reserved: %d threads before, %d after reserving %d, %d with %d goroutines blocked at once; want at least %d reserved and none made by the blocking",
			before, reserved, n, blocked, n, n+2)
	}
	// The check can fail: without a reservation the same blocking makes threads.
	if before, _, blocked := run("none"); blocked <= before {
		t.Errorf("unreserved: %d threads before, %d with %d goroutines blocked: the blocking made none, so it shows nothing", before, blocked, n)
	}
}
