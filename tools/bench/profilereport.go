package main

import (
	"fmt"
	"io"
	"sort"
)

// printProfiles prints where an exec of `true` goes, one column per runtime.
func printProfiles(w io.Writer, ps []ProfileResult) {
	fmt.Fprintf(w, "1b. where an exec of true goes (n=%d interleaved rounds; p50 / p95)\n", ps[0].API.N)
	fmt.Fprint(w, "step\t")
	for _, p := range ps {
		fmt.Fprintf(w, "%s\t", p.Runtime)
	}
	fmt.Fprintln(w)
	row := func(name string, get func(p ProfileResult) Summary) {
		fmt.Fprintf(w, "%s\t", name)
		for _, p := range ps {
			fmt.Fprintf(w, "%s\t", pp(get(p)))
		}
		fmt.Fprintln(w)
	}
	row("exec via the API (user's view)", func(p ProfileResult) Summary { return p.API })
	phases := map[string]bool{}
	for _, p := range ps {
		for k := range p.Daemon {
			phases[k] = true
		}
	}
	names := make([]string, 0, len(phases))
	for k := range phases {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		row("  daemon: "+k, func(p ProfileResult) Summary { return p.Daemon[k] })
	}
	row("exec straight to the agent (session)", func(p ProfileResult) Summary { return p.AgentExec })
	row("  agent: fork to wait status", func(p ProfileResult) Summary { return p.InSandbox })
	row("  agent ping on a session", func(p ProfileResult) Summary { return p.Ping })
	row("  agent ping, new connection", func(p ProfileResult) Summary { return p.PingConn })
	row("  TCP connect to the agent", func(p ProfileResult) Summary { return p.Dial })
	row("execve of a Go binary (extra)", func(p ProfileResult) Summary { return p.GoBinary })
	row("in the sandbox: fork+exec+wait of true", func(p ProfileResult) Summary { return p.SpawnTrue })
	row("  of a minimal static program", func(p ProfileResult) Summary { return p.SpawnMinimal })
	fmt.Fprintln(w)
}
