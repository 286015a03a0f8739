// Command forkbox-agent is the init and request server inside every forkbox
// sandbox. The daemon bind-mounts it at /.forkbox/agent and starts it as PID 1:
//
//	/.forkbox/agent init     act as init (reap, forward SIGTERM) and serve
//	/.forkbox/agent serve    serve only, watching just its own descendants
//	/.forkbox/agent version  print the version
//
// and, in a pre-booted sandbox's placeholder, hold and sethostname (hold.go).
//
// Configuration comes from FORKBOX_AGENT_ADDR (default ":7077"),
// FORKBOX_AGENT_TOKEN (required; erased from the environment block at
// start), FORKBOX_MEMORY_LIMIT (bytes, 0 = off) and FORKBOX_PIDS_LIMIT
// (RLIMIT_NPROC of every process it starts, 0 = none). The helper mode
//
//	/.forkbox/agent exec-limited N BIN ARGV...
//
// is how the agent applies that limit between fork and exec.
// After a memory fork the daemon's fork notice replaces the token and the
// agent runs /etc/forkbox/on-fork or /.forkbox/on-fork (see package agent).
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"

	"github.com/forkbox/forkbox/internal/agent"
)

func main() {
	mode := "init"
	if len(os.Args) > 1 {
		mode = os.Args[1]
	}
	if mode == agent.HelperExecLimited {
		// Between the agent's fork and the user's command: no logger, no
		// config; the error goes to the command's stderr.
		err := agent.ExecLimited(os.Args[2:])
		fmt.Fprintf(os.Stderr, "forkbox-agent: %v\n", err)
		os.Exit(127)
	}
	switch mode {
	case "hold":
		hold()
		return
	case "sethostname":
		if err := setHostname(os.Args[2:]); err != nil {
			fmt.Fprintf(os.Stderr, "forkbox-agent: %v\n", err)
			os.Exit(1)
		}
		return
	}
	// The agent's log goes to init's stderr, a file on the host: bounded.
	log := slog.New(slog.NewTextHandler(agent.NewCappedWriter(os.Stderr, agent.MaxLogBytes), &slog.HandlerOptions{Level: slog.LevelInfo}))
	slog.SetDefault(log)
	switch mode {
	case "version":
		fmt.Println(agent.Version)
		return
	case "init", "serve":
	default:
		fmt.Fprintf(os.Stderr, "usage: %s init|serve|version\n", os.Args[0])
		os.Exit(2)
	}
	cfg, err := agent.ConfigFromEnv()
	if err != nil {
		log.Error("agent: config", "err", err)
		os.Exit(2)
	}
	// "init" acts as init only when it really is PID 1.
	cfg.Init = mode == "init" && os.Getpid() == 1
	if cfg.Init {
		// Nothing of the agent's goes to stdout; what the runtime gave it
		// there is a host file.
		if err := agent.StdoutToNull(); err != nil {
			log.Warn("agent: stdout to /dev/null", "err", err)
		}
	}
	cfg.Logger = log
	if cfg.PidsLimit == 0 {
		// No limit of its own to apply (crun): the host pids cgroup binds
		// the agent with the tenant, so it makes its spare threads now,
		// beside serving (agent.SpareThreads).
		go func() {
			n, err := agent.ReserveThreads(agent.SpareThreads)
			log.Debug("agent: spare threads made", "threads", n, "err", err)
		}()
	}
	if err := agent.Run(context.Background(), cfg); err != nil {
		log.Error("agent", "err", err)
		os.Exit(1)
	}
}
