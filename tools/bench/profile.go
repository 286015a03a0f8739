package main

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/agent"
	"github.com/forkbox/forkbox/internal/store"
)

// ProfileResult is where the time of an exec of `true` goes on one runtime
// (the profile section): the same sandbox measured from the API down to
// the process in the sandbox, the steps interleaved round by round.
type ProfileResult struct {
	Runtime string `json:"runtime"`
	// API is sb.Exec(true) through the daemon: what a user sees.
	API Summary `json:"api_exec_true"`
	// Dial is one TCP connect from the host to the agent (then closed).
	Dial Summary `json:"tcp_dial"`
	// Ping is the agent's cheapest request on a session (one connection
	// for all calls, as the daemon makes them; an agent without sessions
	// gets a connection per call).
	Ping Summary `json:"agent_ping"`
	// PingConn is the same on a connection of its own (dial, token).
	PingConn Summary `json:"agent_ping_new_connection"`
	// AgentExec is exec `true` sent straight to the agent, no daemon, on
	// the session.
	AgentExec Summary `json:"agent_exec_true"`
	// InSandbox is the agent's own figure for that exec: from before its
	// fork to the process's wait status (spawn, any helper, run, exit).
	InSandbox Summary `json:"agent_in_sandbox"`
	// GoBinary is exec of a static Go binary (the agent's `version`) minus
	// exec `true`, both straight to the agent: what one execve of a Go
	// program (like the old exec-limited helper) costs in this runtime.
	GoBinary Summary `json:"go_binary_execve"`
	// SpawnTrue and SpawnMinimal are the spawn floor (spawnfloor.go):
	// fork, exec and wait of /bin/true, and of a minimal static program,
	// timed by a program inside the sandbox, no agent involved.
	SpawnTrue    Summary `json:"in_sandbox_spawn_true"`
	SpawnMinimal Summary `json:"in_sandbox_spawn_minimal"`
	// Daemon are the daemon's own phases of the API execs (from its debug
	// log; empty when the daemon does not log them).
	Daemon map[string]Summary `json:"daemon_phases,omitempty"`
}

// measureProfile breaks an exec down on runtime rt. It needs the throwaway
// daemon (it reads the sandbox's agent address and token from its store).
func (b *bench) measureProfile(ctx context.Context, rt string) (ProfileResult, error) {
	r := ProfileResult{Runtime: rt}
	if b.stateDir == "" {
		return r, fmt.Errorf("profile: needs the throwaway daemon (not --host): %w", errdefs.ErrFailedPrecondition)
	}
	sb, err := b.create(ctx, rt)
	if err != nil {
		return r, err
	}
	defer b.close(ctx, sb)
	st, err := store.Open(ctx, filepath.Join(b.stateDir, "forkbox.db"))
	if err != nil {
		return r, err
	}
	rec, err := st.GetSandbox(ctx, sb.ID)
	st.Close()
	if err != nil {
		return r, err
	}
	addr := net.JoinHostPort(rec.IP, "7077")
	ac := agent.NewSessionClient(addr, rec.AgentToken)
	defer ac.Close()
	conn1 := agent.NewClient(addr, rec.AgentToken)
	var api, dial, ping, ping1, ex, in, gobin []float64
	logFrom := b.logSize()
	for i := range b.opts.execReps + 1 {
		t := time.Now()
		if _, err := execTrue(ctx, sb); err != nil {
			return r, err
		}
		a := ms(time.Since(t))
		t = time.Now()
		conn, err := (&net.Dialer{Timeout: 2 * time.Second}).DialContext(ctx, "tcp", addr)
		if err != nil {
			return r, fmt.Errorf("profile: dial %s: %v: %w", addr, err, errdefs.ErrUnavailable)
		}
		d := ms(time.Since(t))
		conn.Close()
		t = time.Now()
		if _, err := ac.Ping(ctx); err != nil {
			return r, err
		}
		p := ms(time.Since(t))
		t = time.Now()
		if _, err := conn1.Ping(ctx); err != nil {
			return r, err
		}
		p1 := ms(time.Since(t))
		t = time.Now()
		res, err := ac.Exec(ctx, agent.ExecRequest{Argv: []string{"true"}}, nil, nil)
		if err != nil {
			return r, err
		}
		e := ms(time.Since(t))
		t = time.Now()
		if _, err := ac.Exec(ctx, agent.ExecRequest{Argv: []string{"/.forkbox/agent", "version"}}, nil, nil); err != nil {
			return r, err
		}
		g := ms(time.Since(t))
		if i == 0 {
			continue // warm-up
		}
		api, dial, ping, ping1, ex, in = append(api, a), append(dial, d), append(ping, p), append(ping1, p1), append(ex, e), append(in, ms(res.Duration))
		gobin = append(gobin, g-e)
	}
	r.API, r.Dial, r.Ping, r.PingConn, r.AgentExec, r.InSandbox, r.GoBinary =
		summarize(api), summarize(dial), summarize(ping), summarize(ping1), summarize(ex), summarize(in), summarize(gobin)
	r.Daemon = b.daemonPhases(logFrom, daemonExecPhases, sb.ID)
	if b.spawnFloor != nil {
		tr, mi, err := measureSpawnFloor(ctx, ac, b.spawnFloor)
		if err != nil {
			return r, err
		}
		r.SpawnTrue, r.SpawnMinimal = summarize(tr), summarize(mi)
	}
	return r, nil
}
