// Package agent is forkbox's in-sandbox agent and the daemon's client for it.
//
// The agent is a small static binary, bind-mounted read-only at
// /.forkbox/agent and started as every sandbox's PID 1 with the arguments
// ["/.forkbox/agent", "init"]. As init it reaps zombies and forwards SIGTERM;
// as a server it answers the daemon over TCP (FORKBOX_AGENT_ADDR, default
// ":7077"), each connection authenticated by FORKBOX_AGENT_TOKEN. It runs
// commands (execs), reads, writes and lists files, calls sync(2), and enforces
// the sandbox's memory limit itself (FORKBOX_MEMORY_LIMIT), because gVisor has
// no OOM killer inside the sandbox, and, under gVisor, its pids limit
// (FORKBOX_PIDS_LIMIT).
//
// # What the tenant cannot reach
//
// The token comes in init's environment (the one channel both runtimes and
// a memory restore carry without extra plumbing) and leaves no copy a
// tenant can read:
//
//   - at start the agent unsets it and overwrites its value with NULs in
//     the process's original environment block, the memory that
//     /proc/1/environ shows (read through /proc/self/mem: the Go runtime
//     keeps its own copies, which Unsetenv drops). So even the agent's own
//     file API, which reads as the agent, finds no token in
//     /proc/1/environ;
//   - as init it makes itself non-dumpable (PR_SET_DUMPABLE 0): a process
//     without CAP_SYS_PTRACE, which no sandbox process has, can neither
//     ptrace it nor open /proc/1/{environ,mem,fd/*}; Linux and gVisor both
//     check ptrace access there. Execs are dumpable again after execve;
//   - user processes get no FORKBOX_* variable (see Config.Env).
//
// Why not the alternatives: a file bind-mounted into the sandbox cannot be
// unmounted by an agent without CAP_SYS_ADMIN and would stay readable; an
// inherited descriptor needs per-runtime plumbing (--preserve-fds) on run
// and restore alike, and its /proc/1/fd link is as reachable as environ
// without the non-dumpable flag that protects both anyway; trust on first
// use lets whoever connects first (another sandbox on the bridge) take the
// agent. The token stays in the agent's heap and in the host-side bundle
// (config.json), neither readable from inside.
//
// Init's stdout and stderr are a log file on the host. The agent points its
// stdout at /dev/null, caps what it writes to stderr over its life at
// MaxLogBytes (then one notice, then nothing), and, being non-dumpable,
// cannot have /proc/1/fd/1 or /proc/1/fd/2 opened by a tenant.
//
// # Tokens after a memory fork
//
// Children restored from a memory image wake up with the source's token
// and get their own with a fork notice (below). The source, restored in
// place, must stop accepting the token its children know: the daemon calls
// Client.RotateToken. A rotated token is pending: the agent accepts the old
// and the new one until the first request made with the new one, then only
// the new one. The daemon rotates, records the new token, then makes any
// call with it; a crash in between leaves the recorded token working.
//
// # Limits under gVisor
//
// Pids: the host pids cgroup of a gVisor sandbox counts the sentry's and
// gofer's threads and systrap's stub processes (about two host tasks per
// sandbox task), so a host limit equal to the tenant's kills the runtime
// instead of refusing the tenant's fork. The daemon gives the host cgroup
// headroom and passes the tenant's limit as FORKBOX_PIDS_LIMIT; the agent
// starts every process through its own binary in helper mode
// ("exec-limited N BIN ARGV...", one extra execve), which sets RLIMIT_NPROC
// to N before it execs the command. The sentry counts tasks per user and
// refuses a clone past the limit with EAGAIN. The agent's own threads count
// towards it but its own forks are not limited, so it can always start an
// exec. What it does not bound: a tenant that switches to other uids gets
// a count per uid; the host limit still bounds the sandbox as a whole (and
// then kills it). gVisor's own pids cgroup controller enforces pids.max
// too, but its cgroupfs is read-only in the sandbox and runsc does not set
// it from the spec. Under crun the host cgroup is exact (and RLIMIT_NPROC
// does not bind root there).
//
// Memory (measured here, gVisor 2026-09 build, systrap, cgroup v1): the
// sentry's cgroupfs memory.limit_in_bytes is a stub (not enforced) and
// --total-memory only sets what the sandbox is told; RLIMIT_AS is enforced
// per mmap but breaks runtimes that reserve address space (V8, the JVM);
// RLIMIT_DATA binds only brk. When the host cgroup reaches its limit the
// kernel OOM killer kills the sentry (it maps all sandbox memory): the
// whole sandbox dies. So the agent's watchdog is the in-sandbox enforcer
// (it kills the largest process and marks its exec OOM-killed; the exec is
// registered before the watchdog can see its pid) and the host cgroup the
// backstop. It enforces after the fact: against an allocation of twice a
// 64 MiB limit (e2e TestMeasureFastAllocation, 20 rounds each) the process
// was killed with oom_killed and the agent lived every time, but a
// page-faulting allocator held up to 5.8 MiB over the limit and a single
// 128 MiB read(2) (the sentry copies it into tenant memory) its whole
// buffer.
//
// With a runsc built with scripts/gvisor/memory-limit.patch the sentry
// enforces the limit itself when it allocates (the daemon passes it as an
// OCI annotation) and SIGKILLs the largest process; the agent attributes
// such a kill from the sandbox's kernel log (sentryoom.go). The watchdog
// stays on (the daemon cannot tell the two runsc apart): the sentry keeps
// the charged memory under the limit, so the watchdog fires only when the
// summed RSS, which also counts mapped file pages once per process, passes it.
//
// An exact limit from the host does not work with this gVisor (spiked,
// figures in SECURITY.md, "Memory limits under gVisor"): with the host
// limit at the tenant's plus the sentry's overhead and oom_kill_disable=1,
// the allocating stub thread sleeps at the limit, but so does the gofer,
// and the sandbox cannot take a kill (runsc exec fails with ENOMEM or kills
// the sentry, control replies fail for socket memory, runsc kill waits);
// raising the limit by a rescue margin wakes the allocation first, which
// fills the margin at host speed before the kill lands (10 of 10 rounds
// with 64 MiB), and a sandbox rescued several times was left wedged;
// keeping the blocked stub from running while the limit is raised (frozen
// freezer cgroup, or a throttled cpu cgroup) loses the sandbox (systrap
// loses the stub). The limit has to live in the sentry's allocator.
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
// A pty exec (op "pty") runs its command on a pseudo-terminal allocated in
// the sandbox, as the leader of its own session: the agent answers with a
// started frame ('S'), then takes input, resize ('Z') and kill frames and
// streams what the terminal prints (see pty.go).
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
