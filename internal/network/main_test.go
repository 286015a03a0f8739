package network

import (
	"errors"
	"fmt"
	"os"
	"syscall"
	"testing"
)

// hostLock is held for the whole test binary. These tests change the
// host's own network (veths named by pid, but also fixed 10.231.n.0/30
// uplink subnets and host routes to test addresses such as
// 169.254.169.254), so two runs of this package on one host at once would
// collide ("file exists", dials that time out). The lock makes a second
// run wait for the first.
const hostLock = "/run/forkbox-network-test.lock"

func TestMain(m *testing.M) {
	if os.Getenv(wedgedMainEnv) != "" {
		os.Exit(wedgedMain())
	}
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if os.Geteuid() == 0 {
		f, err := os.OpenFile(hostLock, os.O_CREATE|os.O_RDWR, 0o600)
		if err != nil {
			fmt.Fprintf(os.Stderr, "network tests: %v\n", err)
			return 1
		}
		// Closing f (or its finalizer, once f is unreachable) drops the
		// lock, so f is closed only after the tests have run.
		defer f.Close()
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if errors.Is(err, syscall.EWOULDBLOCK) {
			fmt.Fprintf(os.Stderr, "network tests: another run holds %s; waiting for it\n", hostLock)
			err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "network tests: lock %s: %v\n", hostLock, err)
			return 1
		}
	}
	if os.Geteuid() == 0 {
		// Holding the lock, no other run of these tests is alive: what
		// one left (killed mid-run) is swept, or its bridge and routes on
		// the same 10.231.n subnets would break this run's.
		if err := sweepStale(); err != nil {
			fmt.Fprintf(os.Stderr, "network tests: sweep what a killed run left: %v\n", err)
			return 1
		}
	}
	return m.Run()
}
