package main

import (
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"

	"github.com/forkbox/forkbox/internal/agent"
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
// hostname of every container but the first; so a pre-booted sandbox is
// named for its tenant by the placeholder, which alone holds
// CAP_SYS_ADMIN: the daemon runs sethostname in it, or (a memory fork's
// child) the tenant's agent asks hold's hostname service
// (agent/holdname.go).

// hold blocks for ever: as init, signals without a handler are ignored, and
// those Go handles are taken here and dropped.
func hold() {
	// The hostname service for the tenant's agent (agent/holdname.go); a
	// placeholder that cannot listen still holds, and is renamed by
	// runsc exec.
	if l, err := net.Listen("unix", agent.HoldSocket); err == nil {
		go agent.ServeHostnames(l)
	}
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	for range ch {
	}
}

// setHostname sets the hostname to args[0].
func setHostname(args []string) error {
	if len(args) != 1 {
		return fmt.Errorf("sethostname: want one name")
	}
	return agent.SetHostname(args[0])
}
