package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/hostproc"
	"github.com/forkbox/forkbox/internal/network"
	"github.com/forkbox/forkbox/internal/runtime/runsc"
	"github.com/forkbox/forkbox/internal/store"
)

// Pre-booted gVisor sandboxes (serve --preboot N). Booting a sentry is most
// of a gVisor sandbox's start, so the daemon keeps up to N sandboxes booted
// ahead of demand, each with its ID, address, netns (with its egress rules)
// and cgroup (with its limits), running only a placeholder container (the
// agent binary in its trusted "hold" mode). A create or a fork child whose
// runtime, resources and egress policy match takes one: its writable layer
// is mounted and started as a second container inside the running sandbox
// (runsc/pod.go), and it becomes that sandbox, with the pre-booted ID. The
// tenant's agent is its container's init, reached as in any sandbox.
//
// Rules the pool keeps:
//   - one tenant per pre-booted sandbox, never reused: a member is handed
//     out once (under the pool's lock, and in the store by ClaimPreboot,
//     which deletes its preboot row in the same transaction that records
//     the sandbox) and closed with its tenant;
//   - members not handed out are never re-adopted after a restart: their
//     rows name what to tear down (dropPreboots);
//   - at most size members exist (ready or booting); one boots at a time,
//     and none while a create or fork is under way (the pool takes CPU only
//     when the daemon is otherwise idle); the pool fills with members for
//     the key asked for last (the daemon's defaults at first), and members
//     of another key make room for them, oldest first; once both kinds
//     (booted, created) have been asked for, each keeps about half the
//     pool, for its key asked for last (targets);
//   - Close stops the refill and destroys the members not handed out.

// podPrefix makes a pre-booted sandbox's placeholder container id from the
// sandbox's (its tenant container's) id. A prefix, not a suffix: runsc
// takes a unique prefix of an id for the id, so "sb-x" would name "sb-x-pod".
const podPrefix = "pod-"

func podID(id string) string { return podPrefix + id }

// prebootKey is what a pre-booted sandbox was booted for: what its sentry,
// netns and cgroup fix at boot, and its kind.
type prebootKey struct {
	runtime     string
	cpu         float64
	memory      int64
	pids        int64
	egress      string
	allow, deny string
	// created: the placeholder is created (`runsc create`: booted, not
	// started), for the child of a memory fork of a source that ran in a
	// pre-booted sandbox: the image's placeholder is restored into it
	// (runsc/created.go), and the tenant into that. Otherwise it runs
	// (`runsc run`), for creates and filesystem fork children. A
	// restore needs a created container; a start needs a running one.
	created bool
}

// kind names a key's kind in events and logs.
func (k prebootKey) kind() string {
	if k.created {
		return "created"
	}
	return "booted"
}

func keyOf(rt string, cfg store.SandboxConfig) prebootKey {
	return prebootKey{runtime: rt, cpu: cfg.CPU, memory: cfg.MemoryBytes, pids: cfg.Pids, egress: cfg.Egress,
		allow: strings.Join(cfg.EgressAllow, ","), deny: strings.Join(cfg.EgressDeny, ",")}
}

// prebooted is one member of the pool.
type prebooted struct {
	id  string
	ip  netip.Addr
	key prebootKey
	nw  *network.Network
	pid int // its sandbox process on the host (0: not known)
}

// PrebootStats counts what the pool did since the daemon started.
type PrebootStats struct {
	Size, Ready  int
	ReadyCreated int // of Ready, the created kind
	// Pending is how many members the pool still has to boot (the one
	// booting included) to hold its share of the keys asked for last; 0
	// when it has settled. A pool whose boots fail stays pending.
	Pending            int
	Hits, Misses       int64
	Booted, BootFailed int64
	Discarded          int64
}

// prebootPool is the book of members; the refill goroutine
// (runPreboot) does the I/O.
type prebootPool struct {
	size int
	kick chan struct{}

	mu      sync.Mutex
	ready   []*prebooted // oldest first
	booting bool
	// want and wantCreated are the keys last asked for of each kind
	// (wantCreated nil: none asked for yet); createdLast says which kind
	// was asked for last.
	want        prebootKey
	wantCreated *prebootKey
	createdLast bool
	stats       PrebootStats
}

func newPrebootPool(size int, want prebootKey) *prebootPool {
	return &prebootPool{size: size, want: want, kick: make(chan struct{}, 1), stats: PrebootStats{Size: size}}
}

func (p *prebootPool) wake() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// take hands out a member booted for key, or nil; either way key becomes
// the one the refill boots for.
func (p *prebootPool) take(key prebootKey) *prebooted {
	p.mu.Lock()
	defer p.mu.Unlock()
	defer p.wake()
	if key.created {
		p.wantCreated, p.createdLast = &key, true
	} else {
		p.want, p.createdLast = key, false
	}
	for i, m := range p.ready {
		if m.key == key {
			p.ready = slices.Delete(p.ready, i, i+1)
			p.stats.Hits++
			return m
		}
	}
	p.stats.Misses++
	return nil
}

// takeLive hands out a booted member for key, as take does, but never one
// whose sandbox has died while it waited (killed, or out of memory): that
// one is torn down and the next tried. Before, the create that took it
// failed (its tenant could not start in a dead sandbox).
func (d *Daemon) takeLive(ctx context.Context, key prebootKey) *prebooted {
	for {
		m := d.pre.take(key)
		if m == nil || m.pid <= 0 || !hostproc.Exited(m.pid) {
			return m
		}
		d.log.Warn("preboot: a pre-booted sandbox died while it waited; torn down", slog.String("sandbox", m.id), slog.Int("pid", m.pid))
		d.destroyPreboot(context.WithoutCancel(ctx), m)
	}
}

// takeCreated hands out a created member for the child of memory
// checkpoint ck (key: the child's runtime and resources), or nil: when the
// image is of a source that ran in a pre-booted sandbox and its placeholder
// spec fits the one members are created with (createdFits). Other images
// leave the pool alone.
func (d *Daemon) takeCreated(ck *store.Checkpoint, key prebootKey) *prebooted {
	pod, err := d.readPodSpec(d.memImageDir(ck.ID))
	if err != nil || pod == nil || !d.createdFits(pod, key) {
		return nil
	}
	key.created = true
	return d.pre.take(key)
}

// putBack returns a member that was taken but not used (its claim was not
// attempted).
func (p *prebootPool) putBack(m *prebooted) {
	p.mu.Lock()
	p.ready = append([]*prebooted{m}, p.ready...)
	p.stats.Hits--
	p.mu.Unlock()
}

// next says what the refill should do now: boot a member for key (boot),
// after destroying evict (when not nil) to make room.
func (p *prebootPool) next() (key prebootKey, evict *prebooted, boot bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.booting {
		return key, nil, false
	}
	wanted := p.targets()
	count := map[prebootKey]int{}
	for _, m := range p.ready {
		count[m.key]++
	}
	for _, w := range wanted {
		if count[w.key] >= w.n {
			continue
		}
		if len(p.ready) >= p.size {
			// Full: the oldest member no kind wants (another key, or one
			// more of a wanted key than its share) makes room.
			i := slices.IndexFunc(p.ready, func(m *prebooted) bool {
				j := slices.IndexFunc(wanted, func(w target) bool { return w.key == m.key })
				return j < 0 || count[m.key] > wanted[j].n
			})
			evict = p.ready[i]
			p.ready = slices.Delete(p.ready, i, i+1)
			p.stats.Discarded++
		}
		p.booting = true
		return w.key, evict, true
	}
	return key, nil, false
}

// target is how many members of key the pool keeps.
type target struct {
	key prebootKey
	n   int
}

// targets shares the pool between the kinds: all of it for the key asked
// for last while only one kind has been asked for (or the pool holds one);
// then half each, the kind asked for last taking the odd one and coming
// first. A host that alternates creates and memory forks keeps members of
// both kinds instead of replacing one with the other at every switch. The
// counts add up to the pool's size.
func (p *prebootPool) targets() []target {
	if p.wantCreated == nil || p.size == 1 {
		if p.createdLast {
			return []target{{*p.wantCreated, p.size}}
		}
		return []target{{p.want, p.size}}
	}
	last, other := target{p.want, (p.size + 1) / 2}, target{*p.wantCreated, p.size / 2}
	if p.createdLast {
		last.key, other.key = other.key, last.key
	}
	return []target{last, other}
}

// booted ends a boot.
func (p *prebootPool) booted(m *prebooted) {
	p.mu.Lock()
	p.booting = false
	if m != nil {
		p.ready = append(p.ready, m)
		p.stats.Booted++
	} else {
		p.stats.BootFailed++
	}
	p.mu.Unlock()
}

// drain takes every ready member out of the pool.
func (p *prebootPool) drain() []*prebooted {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := p.ready
	p.ready = nil
	return out
}

// PrebootStats returns the pool's counters (zero without a pool).
func (d *Daemon) PrebootStats() PrebootStats {
	if d.pre == nil {
		return PrebootStats{}
	}
	d.pre.mu.Lock()
	defer d.pre.mu.Unlock()
	s := d.pre.stats
	s.Ready, s.Pending = len(d.pre.ready), d.pre.pending()
	for _, m := range d.pre.ready {
		if m.key.created {
			s.ReadyCreated++
		}
	}
	return s
}

// pending counts the members still to boot (the one booting included) for
// the pool to hold its targets; p.mu is held.
func (p *prebootPool) pending() int {
	count := map[prebootKey]int{}
	for _, m := range p.ready {
		count[m.key]++
	}
	n := 0
	for _, w := range p.targets() {
		n += max(0, w.n-count[w.key])
	}
	if p.booting && n == 0 {
		// A boot for a key no longer wanted (its member will make room
		// next): not settled either.
		n = 1
	}
	return n
}

// startPreboot starts the refill goroutine when the pool is on and gVisor
// is available.
func (d *Daemon) startPreboot(ctx context.Context) {
	if d.cfg.Preboot <= 0 {
		return
	}
	if _, ok := d.runtimes[RuntimeGVisor]; !ok {
		d.log.Warn("preboot: gVisor is not available; no sandboxes are pre-booted")
		return
	}
	d.pre = newPrebootPool(d.cfg.Preboot, keyOf(RuntimeGVisor, defaultConfig()))
	d.bg.Add(1)
	go func() {
		defer d.bg.Done()
		d.runPreboot(ctx)
	}()
	d.pre.wake()
}

// runPreboot boots members, one at a time, whenever it is kicked and the
// daemon has no create or fork under way; it ends with ctx.
func (d *Daemon) runPreboot(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-d.pre.kick:
		}
		for ctx.Err() == nil && d.launching.Load() == 0 {
			key, evict, boot := d.pre.next()
			if !boot {
				break
			}
			if evict != nil {
				d.destroyPreboot(ctx, evict)
			}
			m, err := d.bootPreboot(ctx, key)
			if err != nil && ctx.Err() == nil {
				d.log.Warn("preboot: boot failed", "err", err)
			}
			d.pre.booted(m)
			if err != nil {
				// Not again until something changes (a launch ends, a
				// member is taken): a failing boot must not spin.
				break
			}
		}
	}
}

// busyUntil marks a create or fork under way (the refill waits for it); the
// returned func ends it and kicks the refill.
func (d *Daemon) busyUntil() func() {
	d.launching.Add(1)
	return func() {
		d.launching.Add(-1)
		if d.pre != nil {
			d.pre.wake()
		}
	}
}

// closePreboot destroys the members not handed out (the refill has
// stopped).
func (d *Daemon) closePreboot(ctx context.Context) {
	if d.pre == nil {
		return
	}
	for _, m := range d.pre.drain() {
		d.destroyPreboot(ctx, m)
	}
}

// bootPreboot boots one member for key: record, address, netns, cgroup and
// the placeholder container. On failure what was made is torn down.
func (d *Daemon) bootPreboot(ctx context.Context, key prebootKey) (_ *prebooted, err error) {
	t0 := time.Now()
	cfg := defaultConfig()
	cfg.CPU, cfg.MemoryBytes, cfg.Pids, cfg.Egress = key.cpu, key.memory, key.pids, key.egress
	if key.allow != "" {
		cfg.EgressAllow = strings.Split(key.allow, ",")
	}
	if key.deny != "" {
		cfg.EgressDeny = strings.Split(key.deny, ",")
	}
	pol, err := policyOf(cfg)
	if err != nil {
		return nil, err
	}
	if err := d.requireDNS(pol); err != nil {
		return nil, err
	}
	m := &prebooted{id: newID("sb-"), key: key}
	if m.ip, err = d.recordPreboot(ctx, m); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			d.destroyPreboot(context.WithoutCancel(ctx), m)
		}
	}()
	if m.nw, err = d.net.Setup(ctx, m.id, m.ip, pol); err != nil {
		return nil, fmt.Errorf("preboot network: %w", err)
	}
	dir := d.podBundleDir(m.id)
	if err := d.writePodBundle(ctx, dir, m.id, m.nw.NSPath, key); err != nil {
		return nil, err
	}
	if key.created {
		c, ok := d.runtimes[key.runtime].(creator)
		if !ok {
			return nil, fmt.Errorf("preboot: runtime %s cannot create a container ahead: %w", key.runtime, errdefs.ErrNotImplemented)
		}
		if err := c.Create(runsc.Background(ctx), podID(m.id), dir); err != nil {
			return nil, fmt.Errorf("preboot: create the sandbox: %w", err)
		}
	} else if err := d.runtimes[key.runtime].Run(runsc.Background(ctx), podID(m.id), dir); err != nil {
		return nil, fmt.Errorf("preboot: boot the sandbox: %w", err)
	}
	if err = d.settleCgroup(key.runtime, key.cpu, d.cgroupPath(m.id)); err != nil { // booted (or created): its limit
		return nil, fmt.Errorf("preboot: %w", err)
	}
	if st, err := d.runtimes[key.runtime].State(ctx, podID(m.id)); err == nil {
		m.pid = st.Pid // for takeLive
	}
	d.log.Debug("preboot: sandbox booted", slog.String("sandbox", m.id), slog.String("kind", key.kind()), slog.Duration("took", time.Since(t0)))
	return m, nil
}

// creator is the runtime feature a created member needs: create a
// container ahead, and restore a memory image into it (runsc/created.go).
type creator interface {
	Create(ctx context.Context, id, bundle string) error
	RestoreCreated(ctx context.Context, id, bundle, imageDir string) error
}

// recordPreboot allocates a member's address and records it, atomically
// with respect to creates.
func (d *Daemon) recordPreboot(ctx context.Context, m *prebooted) (netip.Addr, error) {
	d.ipAlloc.Lock()
	defer d.ipAlloc.Unlock()
	ip, err := d.nextIP(ctx)
	if err != nil {
		return netip.Addr{}, err
	}
	return ip, d.store.AddPreboot(ctx, &store.Preboot{ID: m.id, IP: ip.String(), Runtime: m.key.runtime})
}

// destroyPreboot tears down a member not handed out and forgets it; what
// cannot be removed keeps its row, so the next start tries again.
func (d *Daemon) destroyPreboot(ctx context.Context, m *prebooted) {
	d.dropPreboot(ctx, &store.Preboot{ID: m.id, Runtime: m.key.runtime})
}

func (d *Daemon) dropPreboot(ctx context.Context, p *store.Preboot) {
	if err := d.teardown(ctx, &store.Sandbox{ID: p.ID, Runtime: p.Runtime}); err != nil {
		d.log.Warn("preboot: tear down", slog.String("sandbox", p.ID), slog.Any("error", err))
		return
	}
	d.bestEffort(ctx, "preboot: forget", d.store.DeletePreboot(ctx, p.ID), slog.String("sandbox", p.ID))
}

// dropPreboots tears down every member a previous run left (on start,
// before the orphan sweep): they are never handed out after a restart.
func (d *Daemon) dropPreboots(ctx context.Context) error {
	ps, err := d.store.ListPreboots(ctx)
	if err != nil {
		return err
	}
	for _, p := range ps {
		d.log.Info("reconcile: destroying a pre-booted sandbox never handed out", slog.String("sandbox", p.ID))
		d.dropPreboot(ctx, p)
	}
	return nil
}
