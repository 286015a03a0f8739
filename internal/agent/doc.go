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
// file content, or for a list asked with "stream": true, JSON arrays of
// entries) as they are produced, then exactly one result frame ('R', JSON)
// or error frame ('E', JSON {class, message}) and closes. Before an error
// frame the server reads the rest of the request's body (bounded), so that
// closing does not reset the connection and lose the error. A client that
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
//
// # Memory forks
//
// Under gVisor a sandbox's whole memory can be checkpointed and restored
// into several children, so every child's agent wakes up as a copy of the
// source's: the same token, the same idea of who it is. Right after the
// restore (and after a hibernate/wake cycle, with reason "wake") the daemon
// sends each child a fork notice (Client.Forked), authenticated with the
// source's token. The agent then
//
//  1. swaps its token for the notice's: connections already authenticated
//     finish, and from the moment it answers only the new token is accepted;
//  2. sets the hostname with sethostname(2) when it is init (the daemon
//     rewrites /etc/hostname, /etc/machine-id and other files itself; the
//     agent writes none and adds nothing to user processes' environment);
//  3. runs the user's on-fork hook, the first executable of
//     /etc/forkbox/on-fork and /.forkbox/on-fork (Config.ForkHooks), with
//     FORKBOX_FORK_REASON ("fork" or "wake"), FORKBOX_PARENT_ID,
//     FORKBOX_MACHINE_ID and HOSTNAME in its environment, stdin /dev/null,
//     killed with its process group after 30 s. A missing hook is not run; a
//     failing one is reported (exit code, last 4 KiB of output), neither is
//     an error;
//  4. answers with the hook's result and the clock skew (daemon time minus
//     agent time at receipt).
//
// What a memory fork cannot change: everything already in process memory is
// identical in every child. Random seeds and PRNG states, session tokens,
// UUIDs, nonces, temporary names, connection ids and caches of the hostname
// or machine id, generated or read before the checkpoint, stay the same in
// all children, so siblings can produce the same "random" values and collide
// on "unique" ids. The kernel's own randomness (getrandom(2), /dev/urandom)
// is fresh after the restore, but no program reads it again on its own. Only
// the programs themselves can reseed, and the on-fork hook is the place to
// make them: signal them to reseed or reconnect, restart the ones that
// cannot, regenerate ids kept in files. Open TCP connections of the source
// are restored in each child too and will not survive; clients should
// reconnect. The agent itself holds no such state but its token, which the
// notice replaces.
package agent

// Version is the agent's protocol and build version, reported by Ping.
const Version = "0.1.0"
