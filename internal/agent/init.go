package agent

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/errdefs"
)

// Environment variables the daemon sets for the agent. They are removed from
// the agent's environment (and so from every user process's) at start.
const (
	// EnvPrefix begins every one of them. The agent removes every variable
	// with it from its environment and its processes'; the daemon reserves
	// such names for the agent.
	EnvPrefix      = "FORKBOX_"
	EnvAddr        = "FORKBOX_AGENT_ADDR"
	EnvToken       = "FORKBOX_AGENT_TOKEN"
	EnvMemoryLimit = "FORKBOX_MEMORY_LIMIT"
	EnvPidsLimit   = "FORKBOX_PIDS_LIMIT"
	// EnvMemoryEnforcer says who enforces FORKBOX_MEMORY_LIMIT: "agent"
	// (the default: the watchdog, every 10 ms) or "sentry" (a runsc built
	// with scripts/gvisor/memory-limit.patch: the agent reads the sentry's
	// OOM kills from the kernel log, and its watchdog polls every 250 ms
	// for the shared memory the sentry does not refuse).
	EnvMemoryEnforcer = "FORKBOX_MEMORY_ENFORCER"
)

// ConfigFromEnv reads the agent's configuration from the FORKBOX_*
// environment variables, then unsets them. The token's bytes in the
// process's environment block are overwritten (see takeEnv), so that
// /proc/1/environ does not show it.
func ConfigFromEnv() (Config, error) {
	cfg := Config{Addr: os.Getenv(EnvAddr), Token: takeEnv(EnvToken)}
	for _, l := range []struct {
		name string
		v    *int64
	}{{EnvMemoryLimit, &cfg.MemoryLimit}, {EnvPidsLimit, &cfg.PidsLimit}} {
		if v := os.Getenv(l.name); v != "" {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 0 {
				return cfg, fmt.Errorf("%s=%q: %w", l.name, v, errdefs.ErrInvalidArgument)
			}
			*l.v = n
		}
	}
	switch v := os.Getenv(EnvMemoryEnforcer); v {
	case "", "agent":
	case "sentry":
		cfg.SentryEnforcesMemory = true
	default:
		return cfg, fmt.Errorf("%s=%q (want agent or sentry): %w", EnvMemoryEnforcer, v, errdefs.ErrInvalidArgument)
	}
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, EnvPrefix) {
			k, _, _ := cut(kv, '=')
			os.Unsetenv(k)
		}
	}
	if cfg.Token == "" {
		return cfg, fmt.Errorf("%s is not set: %w", EnvToken, errdefs.ErrInvalidArgument)
	}
	return cfg, nil
}

func cut(s string, sep byte) (string, string, bool) {
	for i := 0; i < len(s); i++ {
		if s[i] == sep {
			return s[:i], s[i+1:], true
		}
	}
	return s, "", false
}

// termGrace is how long the agent waits for its children after forwarding
// SIGTERM before it exits.
const termGrace = 5 * time.Second

// Run is the agent's main: it serves cfg until SIGTERM or SIGINT, which it
// forwards to every process (to the whole sandbox when it is PID 1, else to
// its execs), waits up to termGrace for them, and returns.
func Run(ctx context.Context, cfg Config) error {
	s, err := NewServer(cfg)
	if err != nil {
		return err
	}
	if cfg.Init {
		// No tenant process may read the agent's memory, environment or
		// file descriptors (its token, its host log).
		if err := hideInit(); err != nil {
			return err
		}
		// The agent must survive memory pressure; user processes are reset to 0.
		if err := os.WriteFile("/proc/self/oom_score_adj", []byte("-1000"), 0); err != nil {
			s.log.Info("cannot set oom_score_adj", "err", err)
		} else {
			s.oomAdjusted = true
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sigc := make(chan os.Signal, 1)
	signal.Notify(sigc, unix.SIGTERM, unix.SIGINT)
	defer signal.Stop(sigc)
	// SIGPIPE and friends must not kill init; the Go runtime already ignores
	// SIGPIPE on non-stdio fds, and SIGHUP is of no use to PID 1.
	signal.Ignore(unix.SIGHUP)

	errc := make(chan error, 1)
	go func() { errc <- s.ListenAndServe(ctx) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	case sig := <-sigc:
		s.log.Info("agent: terminating", "signal", sig.String())
	}
	s.signalExecs(unix.SIGTERM)
	if cfg.Init && os.Getpid() == 1 {
		_ = unix.Kill(-1, unix.SIGTERM) // everything in the sandbox but init
	}
	deadline := time.Now().Add(termGrace)
	for time.Now().Before(deadline) && s.children() > 0 {
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	return nil
}

// children counts the agent's live children: every process in the sandbox
// when it is init, else its registered execs.
func (s *Server) children() int {
	if !s.cfg.Init {
		return s.reaper.pending()
	}
	n := 0
	for pid, p := range scanProcs(1) {
		if pid != os.Getpid() && p.ppid == os.Getpid() {
			n++
		}
	}
	return n
}
