package agent

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// ReserveThreads leaves a fresh process with n more threads than it had,
// and the runtime keeps them. It runs in a child process: in this one,
// other tests' idle threads would be reused instead of new ones made.
func TestReserveThreads(t *testing.T) {
	if os.Getenv("FORKBOX_TEST_RESERVE") == "1" {
		before := threadCount()
		got, err := ReserveThreads(6)
		fmt.Printf("before=%d after=%d later=%d err=%v\n", before, got, threadCount(), err)
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestReserveThreads$", "-test.count=1")
	cmd.Env = append(os.Environ(), "FORKBOX_TEST_RESERVE=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v: %s", err, out)
	}
	var before, after, later int
	var errText string
	line := strings.SplitN(string(out), "\n", 2)[0]
	if _, err := fmt.Sscanf(line, "before=%d after=%d later=%d err=%s", &before, &after, &later, &errText); err != nil {
		t.Fatalf("child printed %q: %v", out, err)
	}
	if errText != "<nil>" || after < before+6 || later < before+6 {
		t.Errorf("threads: %d before, %d after reserving 6, %d a moment later (err %s); want at least %d kept", before, after, later, errText, before+6)
	}
}
