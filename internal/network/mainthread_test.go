package network

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// wedgedMainEnv makes the test binary a helper: its main thread moves to a
// network namespace of its own and stays there, as a goroutine that locked
// it there and exited leaves it (the e2e suite's fake outside world did),
// and it prints the forwarding record the package names from another
// goroutine.
const wedgedMainEnv = "FORKBOX_TEST_WEDGED_MAIN"

func init() {
	if os.Getenv(wedgedMainEnv) != "" {
		runtime.LockOSThread() // TestMain runs on the main thread
	}
}

// wedgedMain is the helper's TestMain, on the main thread.
func wedgedMain() int {
	if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
		fmt.Fprintln(os.Stderr, "unshare:", err)
		return 1
	}
	rec := make(chan string)
	go func() { rec <- netnsRecord() }()
	fmt.Printf("record=%q\n", <-rec)
	return 0
}

// TestForwardingRecordIgnoresWedgedMainThread: a process whose main thread
// was left in another network namespace still keeps its forwarding
// record where its own namespace's is. Before, /proc/self named the main
// thread's: the e2e suite's release looked in a record of a deleted
// namespace, and left the host's holder, and ip_forward on, behind.
func TestForwardingRecordIgnoresWedgedMainThread(t *testing.T) {
	requirePrivileges(t)
	var st syscall.Stat_t
	if err := syscall.Stat("/proc/thread-self/ns/net", &st); err != nil {
		t.Fatal(err)
	}
	if st.Ino != initNetnsIno {
		t.Skip("this test runs outside the host's initial network namespace")
	}
	cmd := exec.Command(os.Args[0], "-test.run", "^$")
	cmd.Env = append(os.Environ(), wedgedMainEnv+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helper: %v\n%s", err, out)
	}
	if got := strings.TrimSpace(string(out)); got != `record=""` {
		t.Errorf("helper printed %s, want record=\"\" (the host's)", got)
	}
}
