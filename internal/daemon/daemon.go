// Package daemon is forkbox's engine: the sandbox manager behind the API. It
// owns the lifecycle state machine and composes the image store, the
// snapshotter, the network, the OCI runtime and the in-sandbox agent. Every
// state change is written to the store before it is acted on, and New
// reconciles what the store says with what exists on the host.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/cgroups"
	"github.com/forkbox/forkbox/internal/dnsproxy"
	"github.com/forkbox/forkbox/internal/env"
	"github.com/forkbox/forkbox/internal/image"
	"github.com/forkbox/forkbox/internal/memvault"
	"github.com/forkbox/forkbox/internal/ports"
	"github.com/forkbox/forkbox/internal/runtime"
	"github.com/forkbox/forkbox/internal/snapshot"
	"github.com/forkbox/forkbox/internal/store"
)

// Config configures a daemon.
type Config struct {
	// StateDir holds the database, images, snapshots and bundles.
	StateDir string
	// RunDir holds runtime state that does not survive a reboot (netns
	// files, the runtime's root).
	RunDir string
	// AgentPath is the static forkbox-agent binary mounted into sandboxes.
	AgentPath string
	// RuntimeBinary is the runsc binary ("runsc" from PATH by default).
	RuntimeBinary string
	// CrunBinary is the crun binary ("crun" from PATH by default).
	CrunBinary string
	// DefaultRuntime is "gvisor" (default: untrusted code) or "crun"
	// (trusted code, fastest start).
	DefaultRuntime string
	// Snapshotter is "btrfs" (default) or "copy".
	Snapshotter string
	// BtrfsSize is the size of the sparse btrfs file made when StateDir is
	// not on btrfs.
	BtrfsSize int64
	// MemoryImageKey, when set (64 bytes), keeps memory images (memory
	// checkpoints, hibernated sandboxes) encrypted at rest under it, in a
	// vault at <StateDir>/memvault (memvault); MemoryVaultSize is the
	// vault's sparse image file size (0: memvault.DefaultSize).
	MemoryImageKey  []byte
	MemoryVaultSize int64
	// BtrfsPreallocate allocates that file's whole size up front, so the
	// pool can never grow into the filesystem that holds the ledger
	// (btrfs.Options.Preallocate).
	BtrfsPreallocate bool
	// Bridge and Subnet of the sandbox network.
	Bridge string
	Subnet string
	// NetTable is the nftables table of this daemon's rules and VethPrefix
	// the prefix of its host-side veths (at most 5 bytes). Two daemons on
	// one host need different bridges, tables and prefixes.
	NetTable   string
	VethPrefix string
	// CgroupParent is the cgroup (below each hierarchy's root) under which
	// sandboxes get theirs: <parent>/<sandbox id>. Default "forkbox".
	CgroupParent string
	// CheckpointRetention deletes the checkpoints of closed sandboxes once
	// they are older (0 = keep until deleted).
	CheckpointRetention time.Duration
	// IdleHibernate hibernates a sandbox idle for this long (0 = never).
	IdleHibernate time.Duration
	// MaxLifetime caps every sandbox's deadline at the start of its
	// lifetime (its start, or its last wake) plus this (0 = no cap).
	MaxLifetime time.Duration
	// IdleTimeout expires a sandbox (as its deadline would) that had no
	// exec or file activity for this long (0 = never).
	IdleTimeout time.Duration
	// DefaultDisk is the disk limit of a sandbox that asks for none (0 =
	// none); see quota.go.
	DefaultDisk int64
	// MaxCopyBytes bounds the tar stream of one CopyTo or CopyFrom (0 =
	// DefaultMaxCopy).
	MaxCopyBytes int64
	// MaxSandboxes bounds live sandboxes (0 = 100).
	MaxSandboxes int
	// PortsAddr, when set, serves preview URLs of sandbox ports on this
	// TCP address (see ports.go); PortsDomain names their hosts
	// (<port>-<id>.<domain>, default "localhost"); APIToken, when set, is
	// accepted there as a bearer besides each sandbox's port token.
	PortsAddr   string
	PortsDomain string
	APIToken    string
	// DNSUpstream is the resolver (ip:port) the DNS proxy forwards allowed
	// names to; "" = the first of the host's /etc/resolv.conf.
	DNSUpstream string
	// PtyStallTimeout ends a pty session whose client has taken none of
	// its output for this long (0 = DefaultPtyStallTimeout); see pty.go.
	PtyStallTimeout time.Duration
	// CgroupFavorDynMods switches the host's cgroup favordynmods option on
	// at start (see cgroups.FavorDynMods): runtime starts then stop waiting
	// for RCU grace periods to move processes between cgroups, while forks
	// and exits cost more. Host-wide, and one-way until reboot on Linux
	// 6.18+; off unless forkbox serve --cgroup-favordynmods.
	CgroupFavorDynMods bool
	// Preboot is how many gVisor sandboxes are kept booted ahead of demand
	// (0 = none; see preboot.go).
	Preboot int
	// RunscStandby is how many runsc processes are kept started ahead for
	// gVisor's run, create and restore (0 = none; see runsc.Options.Standby).
	RunscStandby int
	// PropagateSandboxMounts lets each sandbox's mounts (its rootfs below
	// the state directory, its netns file below the run directory)
	// propagate wherever those directories' mounts do, for a Kubernetes
	// node whose state and run volumes are Bidirectional: the host keeps
	// them for the next pod. Without it, they propagate nowhere (a
	// private boundary, a netns directory of its own), and runsc's view
	// follows the host's unmounts (runsc/boundary.go).
	PropagateSandboxMounts bool
	// RunscHugePages runs runsc and its Sentry from a copy on a tmpfs of
	// huge pages at <RunDir>/runsc-bin (see runsc.Options.StageDir).
	RunscHugePages bool
	Log            *slog.Logger
}

// Daemon is the sandbox manager.
type Daemon struct {
	cfg      Config
	log      *slog.Logger
	store    *store.Store
	images   *image.Store
	snaps    snapshot.Snapshotter
	net      netManager
	names    *hostNames // the host-wide names it holds (hostnames.go)
	host     hostOps
	runtimes map[string]runtime.Runtime
	// memRoot and hibRoot are where the memory images of checkpoints and
	// of hibernated sandboxes go; vault is open when they are encrypted
	// (memroot.go).
	memRoot, hibRoot string
	vault            *memvault.Vault

	mu    sync.Mutex // guards locks
	locks map[string]*sync.Mutex
	// ipAlloc serialises address allocation and slot accounting;
	// pendingSlots are slots reserved for children not yet recorded.
	ipAlloc      sync.Mutex
	pendingSlots int
	lastIP       netip.Addr
	sealer       *sealer
	stopJanitor  context.CancelFunc
	actOnce      sync.Once
	activity     *activity
	envs         *env.Manager
	cgroupRoot   string         // where metrics read cgroups (cgroups.Root; tests change it)
	life         *schedule      // the expiry scheduler's book (expiry.go)
	bg           sync.WaitGroup // the janitor's goroutines; Close waits for them
	portKeys     *ports.Keys
	portSrv      *ports.Server   // nil without Config.PortsAddr
	dns          *dnsproxy.Proxy // nil: not started (see startDNSProxy)
	dnsErr       error           // why the proxy did not start (requireDNS)
	pre          *prebootPool    // nil: no pre-booted sandboxes
	launching    atomic.Int32    // creates and forks under way (busyUntil)
	agentClients agents          // session clients per sandbox (agents.go)
}

func (c *Config) setDefaults() error {
	if c.StateDir == "" {
		c.StateDir = "/var/lib/forkbox"
	}
	if c.RunDir == "" {
		c.RunDir = "/run/forkbox"
	}
	if c.Log == nil {
		c.Log = slog.Default()
	}
	if c.DefaultRuntime == "" {
		c.DefaultRuntime = RuntimeGVisor
	}
	if c.Snapshotter == "" {
		c.Snapshotter = "btrfs"
	}
	if c.CgroupParent == "" {
		c.CgroupParent = "forkbox"
	}
	if c.MaxCopyBytes <= 0 {
		c.MaxCopyBytes = DefaultMaxCopy
	}
	if c.MaxSandboxes == 0 {
		c.MaxSandboxes = 100
	}
	if c.PtyStallTimeout <= 0 {
		c.PtyStallTimeout = DefaultPtyStallTimeout
	}
	if c.AgentPath == "" {
		exe, err := os.Executable()
		if err == nil {
			c.AgentPath = filepath.Join(filepath.Dir(exe), "forkbox-agent")
		}
	}
	if _, err := os.Stat(c.AgentPath); err != nil {
		return fmt.Errorf("the sandbox agent binary %q is missing (build it with `make build`, or pass --agent): %w", c.AgentPath, errdefs.ErrFailedPrecondition)
	}
	return nil
}

// New opens the daemon's state, sets up its host resources and reconciles.
func New(ctx context.Context, cfg Config) (*Daemon, error) {
	return open(ctx, cfg, parts{})
}

// open is New with some parts given (unit tests give fakes).
func open(ctx context.Context, cfg Config, p parts) (_ *Daemon, err error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	if err := checkUpstream(cfg.DNSUpstream); err != nil {
		return nil, err
	}
	warnHostLimits(cfg.Log, cfg.MaxSandboxes)
	if cfg.CgroupFavorDynMods {
		favorDynMods(cfg.Log)
	}
	d := &Daemon{cfg: cfg, log: cfg.Log, locks: map[string]*sync.Mutex{}, runtimes: p.runtimes, snaps: p.snaps, net: p.net, host: p.host,
		cgroupRoot: cgroups.Root,
		life:       newSchedule()}
	if d.runtimes == nil {
		d.runtimes = map[string]runtime.Runtime{}
	}
	if d.host == nil {
		d.host = realHost{}
	}
	var undo undoStack
	defer func() {
		if err != nil {
			err = errors.Join(err, undo.run(context.WithoutCancel(ctx)))
		}
	}()
	if p.net == nil {
		// The real host: its host-wide names are this daemon's before
		// anything is set up.
		if d.names, err = lockHostNames(cfg); err != nil {
			return nil, err
		}
		undo.push(func(context.Context) error { d.names.release(); return nil })
	}
	for _, dir := range []string{cfg.StateDir, cfg.RunDir, d.bundlesDir()} {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("state dir: %w", err)
		}
	}
	if err := securePrivateDir(cfg.StateDir); err != nil {
		return nil, err
	}
	if d.store, err = store.Open(ctx, filepath.Join(cfg.StateDir, "forkbox.db")); err != nil {
		return nil, err
	}
	undo.push(func(context.Context) error { return d.store.Close() })
	if d.sealer, err = openSealer(cfg.StateDir); err != nil {
		return nil, err
	}
	if err := d.openMemRoot(ctx); err != nil {
		return nil, err
	}
	undo.push(func(context.Context) error { return d.closeMemRoot() })
	if d.images, err = image.Open(ctx, filepath.Join(cfg.StateDir, "images"), d.log); err != nil {
		return nil, err
	}
	d.images.SetInUse(d.layersInUse)
	if d.snaps == nil {
		if d.snaps, err = openSnapshotter(ctx, cfg, d.log); err != nil {
			return nil, err
		}
	}
	undo.push(func(context.Context) error { return d.snaps.Close() })
	if d.net == nil {
		nm, err := newNetwork(ctx, cfg, d.log)
		if err != nil {
			return nil, err
		}
		d.net = nm
		d.startDNSProxy(ctx, nm)
		undo.push(func(context.Context) error { return d.closeDNS() })
	}
	if p.runtimes == nil {
		undo.push(func(context.Context) error { d.closeRuntimes(); return nil })
		if err := d.openRuntimes(cfg); err != nil {
			return nil, err
		}
	}
	d.warnDiskDefault()
	d.noteMemoryEnforcer(ctx)
	if err := d.reconcile(ctx); err != nil {
		return nil, fmt.Errorf("reconcile: %w", err)
	}
	if err := d.trackLifetimes(ctx); err != nil {
		return nil, err
	}
	d.envs = env.New(ctx, envSandboxes{d}, d.store, d.log)
	janitorCtx, stopJanitor := context.WithCancel(context.WithoutCancel(ctx))
	d.stopJanitor = stopJanitor
	d.startJanitor(janitorCtx)
	d.startIdleHibernation(janitorCtx)
	d.startDegradedRecheck(janitorCtx)
	d.startExpiry(janitorCtx)
	if err := d.startPorts(); err != nil {
		stopJanitor()
		d.bg.Wait()
		d.envs.Close()
		return nil, err
	}
	if err := d.dropPreboots(ctx); err != nil {
		d.log.Warn("reconcile: pre-booted sandboxes of the last run", "err", err)
	}
	if err := d.sweepOrphans(ctx); err != nil {
		// Leftovers that cannot be removed now do not stop the daemon: they
		// are logged, and tried again on the next start.
		d.log.Warn("reconcile: some orphans could not be removed", "err", err)
	}
	// Layers an image removal cut short by a crash left (every sandbox's
	// rootfs is mounted or parked again by now: those stay).
	d.images.Collect(ctx)
	// After the sweep: what the pool makes is nobody's sandbox yet.
	d.startPreboot(janitorCtx)
	return d, nil
}

// Close releases the daemon's handles. Sandboxes keep running: a restarted
// daemon finds them again.
func (d *Daemon) Close() error {
	var perr error
	if d.portSrv != nil {
		perr = d.portSrv.Close() // first: its requests use the store
	}
	if d.envs != nil {
		d.envs.Close() // first: its goroutines use the store
	}
	if d.stopJanitor != nil {
		d.stopJanitor()
	}
	d.bg.Wait()
	d.closePreboot(context.Background())
	d.closeAgents()
	d.closeRuntimes()
	err := errors.Join(perr, d.closeDNS(), d.snaps.Close(), d.store.Close(), d.closeMemRoot())
	d.names.release()
	return err
}

// closeRuntimes releases what the runtimes hold between calls (gVisor's
// standby runsc processes).
func (d *Daemon) closeRuntimes() {
	for name, rt := range d.runtimes {
		if c, ok := rt.(io.Closer); ok {
			if err := c.Close(); err != nil {
				d.log.Warn("closing the runtime", "runtime", name, "err", err)
			}
		}
	}
}

// closeDNS stops the DNS proxy, if it runs.
func (d *Daemon) closeDNS() error {
	if d.dns == nil {
		return nil
	}
	err := d.dns.Close()
	d.dns = nil
	return err
}

// Images returns the image store.
func (d *Daemon) Images() *image.Store { return d.images }

// Store returns the metadata store.
func (d *Daemon) Store() *store.Store { return d.store }

func (d *Daemon) bundlesDir() string          { return filepath.Join(d.cfg.StateDir, "sandboxes") }
func (d *Daemon) bundleDir(id string) string  { return filepath.Join(d.bundlesDir(), id) }
func (d *Daemon) rootfsDir(id string) string  { return filepath.Join(d.bundleDir(id), "rootfs") }
func (d *Daemon) cgroupPath(id string) string { return "/" + d.cfg.CgroupParent + "/" + id }

// lock serialises operations on one sandbox.
func (d *Daemon) lock(id string) func() {
	d.mu.Lock()
	l, ok := d.locks[id]
	if !ok {
		l = &sync.Mutex{}
		d.locks[id] = l
	}
	d.mu.Unlock()
	l.Lock()
	return l.Unlock
}

// locked resolves a sandbox, takes its lock and reads its record again
// under the lock (another operation may have changed it meanwhile). The
// caller calls unlock.
func (d *Daemon) locked(ctx context.Context, idOrName string) (_ *store.Sandbox, unlock func(), err error) {
	sb, err := d.store.GetSandbox(ctx, idOrName)
	if err != nil {
		return nil, nil, err
	}
	unlock = d.lock(sb.ID)
	if sb, err = d.store.GetSandbox(ctx, sb.ID); err != nil {
		unlock()
		return nil, nil, err
	}
	return sb, unlock, nil
}
