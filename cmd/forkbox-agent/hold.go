package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"golang.org/x/sys/unix"
)

// The two helper modes of a pre-booted gVisor sandbox's placeholder
// container (the daemon's preboot pool): the placeholder is the sandbox's
// first container and runs only this trusted code; the tenant's container
// starts beside it later.
//
//	/.forkbox/agent hold              block until killed (the placeholder's init)
//	/.forkbox/agent sethostname NAME  set the sandbox's hostname (run in the placeholder)
//
// A sandbox's containers share one UTS namespace, and gVisor ignores the
// hostname of every container but the first; so the daemon names a
// pre-booted sandbox for its tenant by running sethostname in the
// placeholder, which alone holds CAP_SYS_ADMIN.

// hold blocks for ever: as init, signals without a handler are ignored, and
// those Go handles are taken here and dropped.
func hold() {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	for range ch {
	}
}

// maxHostname is the kernel's limit (HOST_NAME_MAX).
const maxHostname = 64

// setHostname sets the hostname to args[0].
func setHostname(args []string) error {
	if len(args) != 1 || args[0] == "" || len(args[0]) > maxHostname {
		return fmt.Errorf("sethostname: want one name of 1 to %d bytes", maxHostname)
	}
	return unix.Sethostname([]byte(args[0]))
}
