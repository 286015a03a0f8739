// Command forkbox-agent is the init and request server inside every forkbox
// sandbox. The daemon bind-mounts it at /.forkbox/agent and starts it as PID 1:
//
//	/.forkbox/agent init     act as init (reap, forward SIGTERM) and serve
//	/.forkbox/agent serve    serve only, watching just its own descendants
//	/.forkbox/agent version  print the version
//
// Configuration comes from FORKBOX_AGENT_ADDR (default ":7077"),
// FORKBOX_AGENT_TOKEN (required) and FORKBOX_MEMORY_LIMIT (bytes, 0 = off).
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
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
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
	cfg.Logger = log
	if err := agent.Run(context.Background(), cfg); err != nil {
		log.Error("agent", "err", err)
		os.Exit(1)
	}
}
