package agent

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
)

// TestHoldHostnames: the placeholder's hostname service sets the hostname
// of its UTS namespace for a valid request, and refuses what a tenant
// could send to abuse it (too long, a NUL, no newline, a held-open
// connection), answering the next request after each. It runs in a child
// process in a UTS namespace of its own (root), so the host keeps its name.
func TestHoldHostnames(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			t.Fatal("needs root (a UTS namespace)")
		}
		t.Skip("needs root (a UTS namespace)")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "FORKBOX_TEST_ROLE=holdname")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWUTS}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	want := strings.Join([]string{
		"valid: <nil> name=fork-a",
		"too long: sethostname: want one name of 1 to 64 bytes name=fork-a",
		"raw too long: error: request longer than 65 bytes",
		"raw nul: error: sethostname: want one name of 1 to 64 bytes",
		"raw no newline: error: EOF",
		"held open, then valid: <nil> name=fork-b",
	}, "\n") + "\n"
	if string(out) != want {
		t.Errorf("got:\n%s\nwant:\n%s", out, want)
	}
}

// holdnameChild serves hostnames on an abstract socket of its own and
// prints what each request did.
func holdnameChild() {
	addr := fmt.Sprintf("@forkbox-hold-test-%d", os.Getpid())
	l, err := net.Listen("unix", addr)
	if err != nil {
		fmt.Println("listen:", err)
		return
	}
	go ServeHostnames(l)
	name := func() string { h, _ := os.Hostname(); return "name=" + h }
	raw := func(req string, close bool) string {
		c, err := net.Dial("unix", addr)
		if err != nil {
			return err.Error()
		}
		defer c.Close()
		c.Write([]byte(req))
		if close {
			c.(*net.UnixConn).CloseWrite()
		}
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil {
			return err.Error()
		}
		return strings.TrimSpace(line)
	}
	fmt.Println("valid:", askHostname(addr, "fork-a"), name())
	fmt.Println("too long:", askHostname(addr, strings.Repeat("x", 65)), name())
	fmt.Println("raw too long:", raw(strings.Repeat("x", 200)+"\n", false))
	fmt.Println("raw nul:", raw("a\x00b\n", false))
	fmt.Println("raw no newline:", raw("fork-c", true))
	// Connections held open without a request do not keep the next one
	// waiting, up to the service's bound.
	for range holdConns - 1 {
		held, _ := net.Dial("unix", addr)
		defer held.Close()
	}
	fmt.Println("held open, then valid:", askHostname(addr, "fork-b"), name())
}
