package daemon

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/netip"
	"os"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/agent"
	"github.com/forkbox/forkbox/internal/image"
	"github.com/forkbox/forkbox/internal/network"
	"github.com/forkbox/forkbox/internal/store"
)

// CreateOptions is what a sandbox is created with.
type CreateOptions struct {
	Image  string
	Name   string
	CPU    string
	Memory string
	Pids   int64
	Disk   string
	Env    map[string]string
	Cwd    string
	Egress string
	// EgressAllow and EgressDeny are egress lists (network.ParsePolicy).
	EgressAllow, EgressDeny []string
	Runtime                 string
	// Timeout is the sandbox's lifetime from its start (0 = none);
	// OnTimeout what its expiry does (close, the default, or hibernate).
	Timeout   time.Duration
	OnTimeout string
}

const (
	agentPort    = 7077
	readyTimeout = 30 * time.Second
)

func newID(prefix string) string {
	b := make([]byte, 6)
	rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// validate checks options and fills in defaults; it changes nothing. The
// options are checked by the same rules as a fork's or restore's overrides.
func (d *Daemon) validate(ctx context.Context, o *CreateOptions) (*store.SandboxConfig, image.Image, error) {
	if o.Image == "" {
		return nil, image.Image{}, fmt.Errorf("an image is required: %w", errdefs.ErrInvalidArgument)
	}
	cfg, err := withOverrides(defaultConfig(), Overrides{Name: o.Name, CPU: o.CPU, Memory: o.Memory, Pids: o.Pids, Disk: o.Disk,
		Env: o.Env, Cwd: o.Cwd, Egress: o.Egress, Timeout: o.Timeout, OnTimeout: o.OnTimeout,
		EgressAllow: o.EgressAllow, EgressDeny: o.EgressDeny})
	if err != nil {
		return nil, image.Image{}, err
	}
	if err := d.checkDisk(cfg); err != nil {
		return nil, image.Image{}, err
	}
	if o.Runtime == "" {
		o.Runtime = d.cfg.DefaultRuntime
	}
	if _, ok := d.runtimes[o.Runtime]; !ok {
		return nil, image.Image{}, fmt.Errorf("runtime %q is not available on this daemon: %w", o.Runtime, errdefs.ErrInvalidArgument)
	}
	if err := d.checkOnTimeout(cfg, o.Runtime); err != nil {
		return nil, image.Image{}, err
	}
	img, err := d.images.Get(ctx, o.Image)
	if err != nil {
		return nil, image.Image{}, err
	}
	return &cfg, img, nil
}

// Create creates and starts a sandbox, and returns once its agent answers.
func (d *Daemon) Create(ctx context.Context, o CreateOptions) (*store.Sandbox, error) {
	cfg, img, err := d.validate(ctx, &o)
	if err != nil {
		return nil, err
	}
	return d.launch(ctx, launchSpec{name: o.Name, runtime: o.Runtime, cfg: *cfg, img: img})
}

// launchSpec is a sandbox to start: from an image (parentSnapshot "") or
// from a checkpoint.
type launchSpec struct {
	name           string
	runtime        string
	cfg            store.SandboxConfig
	img            image.Image
	parentSnapshot string
	parentID       string
	// creds are copied to the new sandbox (sealed values).
	creds []*store.Credential
	// slotReserved: a slot was reserved for it by reserveSlots.
	slotReserved bool
	// event is extra data for its sandbox.created event.
	event map[string]any
	// pool is the environment whose warm pool it joins.
	pool string
	// memory, when set, is a memory checkpoint to restore: the sandbox
	// continues the checkpointed processes.
	memory *store.Checkpoint
}

// launch records and starts a sandbox. On failure everything it made is torn
// down and the record is closed with the reason.
func (d *Daemon) launch(ctx context.Context, l launchSpec) (_ *store.Sandbox, err error) {
	defer d.busyUntil()()
	start := time.Now()
	ph := d.newPhases(ctx, "create phases")
	id := newID("sb-")
	cfg := l.cfg
	// A pre-booted sandbox, when one fits, is this sandbox: its ID,
	// address, netns and cgroup.
	var pm *prebooted
	if d.pre != nil && l.runtime == RuntimeGVisor {
		if l.memory == nil {
			pm = d.takeLive(ctx, keyOf(l.runtime, cfg))
		} else {
			pm = d.takeCreated(l.memory, keyOf(l.runtime, cfg))
		}
		if pm != nil {
			id = pm.id
		}
	}
	if l.name == "" {
		l.name = id
	}
	cfg.Hostname = l.name
	cfg.Snapshotter = d.cfg.Snapshotter
	cfg.MachineID = randomHex(16)
	sb := &store.Sandbox{ID: id, Name: l.name, State: store.StateCreating, Image: l.img.Name, ImageDigest: l.img.Digest,
		Runtime: l.runtime, Config: cfg, AgentToken: randomHex(16), ParentID: l.parentID, FromCheckpoint: l.parentSnapshot, Pool: l.pool,
		LifetimeFrom: start}
	if cfg.TimeoutMS > 0 {
		sb.Deadline = start.Add(time.Duration(cfg.TimeoutMS) * time.Millisecond)
	}

	unlock := d.lock(id)
	defer unlock()
	if err := d.reserve(ctx, sb, l.slotReserved, pm); err != nil {
		return nil, err
	}
	ph.mark("reserve")
	log := d.log.With("sandbox", id, "name", sb.Name)
	ev := map[string]any{
		"name": sb.Name, "image": sb.Image, "digest": sb.ImageDigest, "runtime": sb.Runtime,
		"cpu": cfg.CPU, "memory_bytes": cfg.MemoryBytes, "pids": cfg.Pids, "egress": cfg.Egress,
	}
	if at := d.ExpiresAt(sb); !at.IsZero() {
		ev["timeout_ms"], ev["on_timeout"], ev["expires_at_unix_ms"] = cfg.TimeoutMS, cfg.OnTimeout, at.UnixMilli()
	}
	if len(cfg.EgressAllow)+len(cfg.EgressDeny) > 0 {
		ev["egress_allow"], ev["egress_deny"] = cfg.EgressAllow, cfg.EgressDeny
	}
	for k, v := range l.event {
		ev[k] = v
	}
	if pm != nil {
		ev["preboot"], ev["preboot_kind"] = true, pm.key.kind()
	}
	defer func() {
		if err != nil {
			// Everything this call made is torn down; the record stays, with
			// the reason: closed, or failed if something could not be
			// removed (so its address is not handed out again).
			cctx := context.WithoutCancel(ctx)
			log.Warn("start failed, cleaning up", "err", err)
			d.recordState(cctx, sb, store.StateFailed, err.Error())
			d.note(cctx, id, store.EventSandboxFailed, map[string]any{"error": err.Error()})
			if cerr := d.teardown(cctx, sb); cerr != nil {
				log.Error("cleanup after failed start; the sandbox stays failed until closed", "err", cerr)
				return
			}
			d.recordState(cctx, sb, store.StateClosed, err.Error())
		}
	}()
	if _, err := d.store.AppendEvent(ctx, id, store.EventSandboxCreated, ev); err != nil {
		return nil, err
	}
	for _, c := range l.creds {
		cc := *c
		cc.SandboxID = id
		if err := d.store.PutCredential(ctx, &cc); err != nil {
			return nil, err
		}
	}
	ph.mark("record")
	if l.memory != nil {
		err = d.startFromMemory(ctx, sb, l.img, l.memory, pm)
	} else {
		err = d.start(ctx, sb, l.img, l.parentSnapshot, pm, ph)
	}
	if err != nil {
		return nil, err
	}
	if err := d.injectCredentialFiles(ctx, sb, l.memory != nil); err != nil {
		return nil, err
	}
	ph.mark("credentials")
	readyMS := msSince(start)
	if err := d.setStateNoting(ctx, sb, store.StateRunning, "", store.EventSandboxReady, map[string]any{"ready_ms": readyMS}); err != nil {
		return nil, err
	}
	d.touch(id)
	d.life.set(id, d.ExpiresAt(sb))
	log.Info("sandbox ready", "ready_ms", readyMS)
	ph.mark("state")
	ph.log(ctx, d.log, id)
	return sb, nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func msSince(t time.Time) float64 { return float64(time.Since(t).Microseconds()) / 1000 }

// reserveSlots reserves up to n sandbox slots for children about to be
// started; it returns how many it got. Unless bestEffort, fewer than n free
// slots is a ResourceExhausted error and nothing is reserved.
func (d *Daemon) reserveSlots(ctx context.Context, n int, bestEffort bool) (int, error) {
	d.ipAlloc.Lock()
	defer d.ipAlloc.Unlock()
	live, err := d.store.CountLive(ctx)
	if err != nil {
		return 0, err
	}
	free := d.cfg.MaxSandboxes - live - d.pendingSlots
	if free < n && !bestEffort {
		return 0, fmt.Errorf("%d slots needed, %d free (the daemon's limit is %d live sandboxes): %w", n, max(free, 0), d.cfg.MaxSandboxes, errdefs.ErrResourceExhausted)
	}
	got := min(n, max(free, 0))
	d.pendingSlots += got
	return got, nil
}

// releaseSlots returns reserved slots that were not used.
func (d *Daemon) releaseSlots(n int) {
	d.ipAlloc.Lock()
	d.pendingSlots -= n
	d.ipAlloc.Unlock()
}

// reserve checks the live-sandbox limit (or takes a slot reserveSlots set
// aside), allocates an address and records the sandbox, atomically with
// respect to other creates. With pm, the sandbox takes the pre-booted
// sandbox's address and its preboot record (store.ClaimPreboot); pm goes
// back to the pool if the limit refuses it, and is destroyed if the claim
// fails.
func (d *Daemon) reserve(ctx context.Context, sb *store.Sandbox, slotReserved bool, pm *prebooted) (err error) {
	claimed := false
	defer func() {
		switch {
		case pm == nil || err == nil:
		case claimed:
			d.destroyPreboot(context.WithoutCancel(ctx), pm)
		default:
			d.pre.putBack(pm)
		}
	}()
	d.ipAlloc.Lock()
	defer d.ipAlloc.Unlock()
	if slotReserved {
		d.pendingSlots--
	}
	// A count and an address lookup or two, whatever the number of live
	// sandboxes: this runs under the allocation lock, once per sandbox.
	live, err := d.store.CountLive(ctx)
	if err != nil {
		return err
	}
	if !slotReserved && live+d.pendingSlots >= d.cfg.MaxSandboxes {
		return fmt.Errorf("%d sandboxes are live, the daemon's limit: %w", live, errdefs.ErrResourceExhausted)
	}
	if pm != nil {
		claimed = true
		sb.IP = pm.ip.String()
		return d.store.ClaimPreboot(ctx, sb)
	}
	ip, err := d.nextIP(ctx)
	if err != nil {
		return err
	}
	sb.IP = ip.String()
	return d.store.CreateSandbox(ctx, sb)
}

// nextIP gives out the next free address after the last one given (a live
// sandbox's or a pre-booted one's is taken). The caller holds d.ipAlloc
// until the address is recorded.
func (d *Daemon) nextIP(ctx context.Context) (netip.Addr, error) {
	ip, err := d.net.AllocateFunc(d.lastIP, func(a netip.Addr) (bool, error) { return d.store.IPInUse(ctx, a.String()) })
	if err != nil {
		return netip.Addr{}, err
	}
	d.lastIP = ip
	return ip, nil
}

// start builds the sandbox's rootfs, network and container, and waits for
// its agent. parentSnapshot, if set, is the committed snapshot to start from.
// It undoes nothing itself: every step makes something teardown finds by the
// sandbox's ID, so launch's failure path (and reconcile, after a crash in the
// middle) removes whatever was made.
//
// With pm the sandbox is that pre-booted sandbox: its network is made, and
// its container starts inside it while the placeholder takes its hostname.
// ph times its steps.
func (d *Daemon) start(ctx context.Context, sb *store.Sandbox, img image.Image, parentSnapshot string, pm *prebooted, ph *phases) error {
	var nw *network.Network
	var err error
	pod := ""
	if pm != nil {
		nw, pod = pm.nw, podID(sb.ID)
		err = d.prepareRootfs(ctx, sb, img, parentSnapshot)
	} else {
		nw, err = d.prepare(ctx, sb, img, parentSnapshot)
	}
	if err != nil {
		return err
	}
	ph.mark("rootfs")
	if err := d.writeBundle(ctx, sb, img, nw, pod); err != nil {
		return err
	}
	ph.mark("bundle")
	named := make(chan error, 1)
	if pm != nil {
		// The container shares the pre-booted sandbox's cgroup: raised for
		// its start here (a fresh boot is, by its spec: cpulimit.go).
		d.raiseCPU(ctx, sb)
		go func() { named <- d.setPodHostname(ctx, sb) }()
	} else {
		named <- nil
	}
	rt := d.runtimes[sb.Runtime]
	err = rt.Run(ctx, sb.ID, d.bundleDir(sb.ID))
	ph.mark("run")
	if herr := <-named; err == nil && herr != nil {
		err = herr
	}
	ph.mark("hostname")
	if err != nil {
		return fmt.Errorf("start %s: %w", rt.Name(), err)
	}
	rctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	t0 := time.Now()
	if err := agent.WaitReady(rctx, d.agent(sb)); err != nil {
		return fmt.Errorf("sandbox agent did not answer within %s (%v); its output: %q: %w", readyTimeout, err, d.initOutput(sb.ID), errdefs.ErrUnavailable)
	}
	d.log.Debug("agent ready", "sandbox", sb.ID, "took", time.Since(t0))
	ph.mark("agent")
	err = d.settleCPU(sb)
	ph.mark("settle")
	return err
}

// prepare makes a sandbox's writable layer (from parentSnapshot, if set),
// mounts its rootfs and sets up its network. The rootfs and the network
// share nothing, so they are made side by side, and prepare returns once
// both are done. When either fails, what the other made is left, like any
// step of start, to the teardown that finds it by the sandbox's ID. When
// both fail, the error is the rootfs's, with the network's as text.
func (d *Daemon) prepare(ctx context.Context, sb *store.Sandbox, img image.Image, parentSnapshot string) (*network.Network, error) {
	pol, err := policyOf(sb.Config)
	if err != nil {
		return nil, err
	}
	if err := d.requireDNS(pol); err != nil {
		return nil, err
	}
	rootfs := make(chan error, 1)
	go func() { rootfs <- d.prepareRootfs(ctx, sb, img, parentSnapshot) }()
	nw, err := d.net.Setup(ctx, sb.ID, netip.MustParseAddr(sb.IP), pol)
	if err != nil {
		err = fmt.Errorf("network: %w", err)
	}
	if rerr := <-rootfs; rerr != nil {
		if err != nil {
			// One class: the rootfs's, which failed first in the order
			// of a start (a caller's retry decision follows it).
			return nil, fmt.Errorf("%w (the network failed too: %v)", rerr, err)
		}
		return nil, rerr
	}
	if err != nil {
		return nil, err
	}
	return nw, nil
}

// prepareRootfs makes a sandbox's writable layer (from parentSnapshot, if
// set) and mounts its rootfs.
func (d *Daemon) prepareRootfs(ctx context.Context, sb *store.Sandbox, img image.Image, parentSnapshot string) error {
	if err := d.snaps.Prepare(ctx, sb.ID, parentSnapshot, d.diskOpts(sb.Config)...); err != nil {
		return fmt.Errorf("prepare rootfs: %w", err)
	}
	mounts, err := d.snaps.Mounts(ctx, sb.ID, img.Layers)
	if err != nil {
		return fmt.Errorf("rootfs mounts: %w", err)
	}
	rootfs := d.rootfsDir(sb.ID)
	if err := os.MkdirAll(rootfs, 0o700); err != nil {
		return fmt.Errorf("bundle: %w", err)
	}
	if err := d.host.MountAll(ctx, mounts, rootfs); err != nil {
		return fmt.Errorf("mount rootfs: %w", err)
	}
	return nil
}
