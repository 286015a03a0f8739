// Package agent is forkbox's in-sandbox agent and the daemon's client for it.
//
// The agent is a small static binary, bind-mounted read-only at
// /.forkbox/agent and started as every sandbox's PID 1 with the arguments
// ["/.forkbox/agent", "init"]. As init it reaps zombies and forwards SIGTERM;
// as a server it answers the daemon over TCP (FORKBOX_AGENT_ADDR, default
// ":7077"), each connection authenticated by FORKBOX_AGENT_TOKEN. It runs
// commands (execs), reads, writes and lists files, calls sync(2), and enforces
// the sandbox's memory limit itself (FORKBOX_MEMORY_LIMIT), because gVisor has
// no OOM killer inside the sandbox.
//
// # Wire protocol
//
// One TCP connection per request. Every message is a frame:
//
//	type byte | stream byte | uint32 big-endian length | payload
//
// The client opens with a header frame ('H', JSON: token, op and arguments),
// then data frames ('D') for stdin or file content, closed by an EOF frame
// ('C'). The server answers with data frames (stream 1 stdout, 2 stderr, 0
// file content) as they are produced, then exactly one result frame ('R',
// JSON) or error frame ('E', JSON {class, message}) and closes. A client that
// goes away (or sends a kill frame 'K') while an exec runs gets the exec's
// process group killed. A token mismatch is answered with an Unauthenticated
// error frame and the connection is closed.
//
// # Background execs
//
// Start runs a command in the background and returns its pid at once. Its
// stdout and stderr both go to /tmp/.forkbox/exec-<pid>.log (truncated when the
// pid is reused), its stdin is /dev/null. Its exit status is reaped and logged
// by the agent and is not reported to the daemon.
package agent

// Version is the agent's protocol and build version, reported by Ping.
const Version = "0.1.0"
