package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/agent"
	"github.com/forkbox/forkbox/internal/cgroups"
	"github.com/forkbox/forkbox/internal/hostproc"
	"github.com/forkbox/forkbox/internal/mount"
	"github.com/forkbox/forkbox/internal/runtime"
	"github.com/forkbox/forkbox/internal/snapshot"
	"github.com/forkbox/forkbox/internal/store"
)

// reconcile makes the host agree with the store after a start or a crash:
//   - a sandbox recorded running, paused or degraded whose container runs
//     and whose agent answers (or that is frozen, when paused) is kept;
//   - one whose runtime reports it running but that cannot be confirmed
//     healthy (its agent is slow, its freezer unreadable), or whose runtime
//     binary is missing, is kept and recorded degraded with the reason:
//     never torn down on a guess; a later reconcile or a close deals with it;
//   - a hibernated sandbox with a whole image stays hibernated;
//   - any other sandbox that is not closed (creating, closing, failed, or
//     whose container is gone) is torn down and recorded closed;
//   - containers, netns, mounts, writable layers, cgroups and bundles that
//     belong to no live sandbox are removed (sweepOrphans).
func (d *Daemon) reconcile(ctx context.Context) error {
	recs, err := d.store.ListSandboxes(ctx, false)
	if err != nil {
		return err
	}
	// Sandboxes are independent, and a slow agent costs its whole wait:
	// several are looked at together.
	errs := make([]error, len(recs))
	sem := make(chan struct{}, reconcileParallelism)
	var wg sync.WaitGroup
	left := d.leftCheckpoints()
	for i, sb := range recs {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			errs[i] = d.reconcileOne(ctx, sb, left[sb.ID])
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// keepEgress applies a kept sandbox's recorded egress policy again.
func (d *Daemon) keepEgress(ctx context.Context, sb *store.Sandbox) {
	if err := d.reapplyEgress(ctx, sb); err != nil {
		d.log.Warn("reconcile: egress policy not applied", slog.String("sandbox", sb.ID), slog.Any("error", err))
	}
}

// reconcileParallelism is how many sandboxes reconcile looks at at once.
const reconcileParallelism = 8

// leftoverCheckpointTimeout bounds reconcile's wait for a checkpoint
// command the last daemon left running (runtime.CheckpointLister).
var leftoverCheckpointTimeout = 2 * time.Minute

// leftCheckpoints lists the checkpoint commands the last daemon left
// running, by sandbox (runtime.CheckpointLister), in one pass.
func (d *Daemon) leftCheckpoints() map[string][]int {
	left := map[string][]int{}
	for _, rt := range d.runtimes {
		if l, ok := rt.(runtime.CheckpointLister); ok {
			for id, pids := range l.RunningCheckpoints() {
				left[id] = append(left[id], pids...)
			}
		}
	}
	return left
}

// reconcileOne finds sb as the host has it and records that; checkpoints
// are the pids of the checkpoint commands of sb the last daemon left
// running, waited for first.
func (d *Daemon) reconcileOne(ctx context.Context, sb *store.Sandbox, checkpoints []int) error {
	log := d.log.With(slog.String("sandbox", sb.ID))
	for _, pid := range checkpoints {
		// A held checkpoint outlives the daemon: it saves, then starts the
		// sandbox again. Found paused meanwhile, the sandbox would be
		// resumed under it, and its save cut short with the sandbox.
		if !hostproc.WaitExited(ctx, pid, leftoverCheckpointTimeout) {
			log.Warn("reconcile: a checkpoint the last daemon left still runs", slog.Int("pid", pid), slog.Duration("waited", leftoverCheckpointTimeout))
		}
	}
	if sb.State == store.StateHibernating || sb.State == store.StateHibernated {
		// A whole image is a hibernated sandbox (a crash may have come
		// before the state was recorded); otherwise the checkpoint never
		// finished and the container may still run.
		if d.hibernationComplete(sb.ID) || d.savedAfterCrash(ctx, sb) {
			// A hibernated sandbox has no container; one that exists is
			// left by a hibernation or a wake cut by the crash (whose
			// restore may have gone on without us), and would make the
			// next wake's restore fail. The image is whole: nothing is lost.
			if err := d.deleteContainers(ctx, sb); !errdefs.IsNotFound(err) {
				d.bestEffort(ctx, "reconcile: release a hibernated container", err, slog.String("sandbox", sb.ID))
			}
			d.detach(ctx, sb) // a crash may have come before hibernate gave its port back
			if sb.State == store.StateHibernating {
				if err := d.setState(ctx, sb, store.StateHibernated, ""); err != nil {
					return err
				}
			}
			d.keepEgress(ctx, sb)
			log.Info("reconcile: sandbox hibernated")
			return nil
		}
		// The checkpoint never finished, and gVisor checkpoints a running
		// sandbox: one a caller had paused was resumed for it, and goes
		// back to paused (checkHealth suspends it again).
		back := store.StateRunning
		if d.userPaused(ctx, sb.ID) {
			back = store.StatePaused
		}
		if err := d.setState(ctx, sb, back, ""); err != nil {
			return err
		}
	}
	switch sb.State {
	case store.StateRunning, store.StatePaused, store.StateDegraded:
		h := d.checkHealth(ctx, sb)
		switch {
		case h.ok:
			d.keepEgress(ctx, sb)
			d.bestEffort(ctx, "reconcile: the CPU limit", d.settleCPU(sb)) // for a start the daemon died in
			if sb.State != h.state {
				if err := d.setState(ctx, sb, h.state, ""); err != nil {
					return err
				}
			}
			d.note(ctx, sb.ID, store.EventSandboxFound, nil)
			log.Info("reconcile: sandbox still running", slog.String("state", string(sb.State)))
			return nil
		case h.reason != "":
			d.keepEgress(ctx, sb)
			if sb.State == store.StateDegraded {
				log.Debug("reconcile: sandbox still degraded", slog.String("reason", h.reason))
				return nil
			}
			if err := d.setStateNoting(ctx, sb, store.StateDegraded, h.reason, store.EventSandboxDegraded, map[string]any{"reason": h.reason}); err != nil {
				return err
			}
			log.Warn("reconcile: sandbox kept, degraded", slog.String("reason", h.reason))
			return nil
		}
		d.note(ctx, sb.ID, store.EventSandboxLost, map[string]any{"reason": "not running after daemon restart"})
	}
	return d.cleanLost(ctx, sb)
}

// degradedRecheck is how often a running daemon looks again at its
// degraded sandboxes.
const degradedRecheck = 30 * time.Second

// startDegradedRecheck reconciles degraded sandboxes again every
// degradedRecheck until ctx ends: one whose agent answers again becomes
// running (or paused), one whose container is gone is cleaned.
func (d *Daemon) startDegradedRecheck(ctx context.Context) {
	d.bg.Add(1)
	go func() {
		defer d.bg.Done()
		t := time.NewTicker(degradedRecheck)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				d.bestEffort(ctx, "recheck degraded sandboxes", d.recheckDegraded(ctx))
			}
		}
	}()
}

// recheckDegraded reconciles every degraded sandbox, under its lock.
func (d *Daemon) recheckDegraded(ctx context.Context) error {
	recs, err := d.store.ListSandboxesInState(ctx, store.StateDegraded)
	if err != nil {
		return err
	}
	var errs []error
	for _, rec := range recs {
		sb, unlock, err := d.locked(ctx, rec.ID)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if sb.State == store.StateDegraded {
			errs = append(errs, d.reconcileOne(ctx, sb, nil))
		}
		unlock()
	}
	return errors.Join(errs...)
}

// cleanLost tears down a sandbox that reconcile found not live, and records
// it closed. If something could not be removed, the sandbox is recorded
// failed with the reason, the ledger says so, and cleanLost returns nil:
// a leftover must not stop the daemon from starting (a later close of the
// sandbox, or the next start, tries again). Only a store that cannot record
// the outcome is an error.
func (d *Daemon) cleanLost(ctx context.Context, sb *store.Sandbox) error {
	was := sb.State
	d.log.Warn("reconcile: cleaning sandbox", slog.String("sandbox", sb.ID), slog.String("state", string(was)))
	if sb.State != store.StateClosing {
		if err := d.setState(ctx, sb, store.StateClosing, sb.Error); err != nil {
			return err
		}
	}
	if err := d.teardown(ctx, sb); err != nil {
		reason := "reconcile could not clean it: " + err.Error()
		if err := d.setStateNoting(ctx, sb, store.StateFailed, reason, store.EventSandboxFailed, map[string]any{"reason": reason}); err != nil {
			return err
		}
		d.log.Warn("reconcile: sandbox left failed; a close retries its cleanup",
			slog.String("sandbox", sb.ID), slog.String("err", err.Error()))
		return nil
	}
	msg := sb.Error
	if msg == "" {
		msg = "cleaned by reconcile (was " + string(was) + ")"
	}
	return d.setStateNoting(ctx, sb, store.StateClosed, msg, store.EventSandboxClosed, map[string]any{"reason": msg})
}

// reconcileAgentTimeout bounds how long reconcile waits for an agent: long
// enough for one that answers slowly on a loaded host (WaitReady's attempts
// of 0.25, 0.5, 1 and 2 s), rather than keep a healthy sandbox degraded
// until the next recheck; short, because a wedged or hostile agent costs it
// at every daemon start (8 sandboxes at a time) and every recheck (one at
// a time, under its lock).
const reconcileAgentTimeout = 5 * time.Second

// health is what reconcile learnt of a recorded-live sandbox: ok with the
// state it is in (running or paused); or, not ok, a reason to keep it
// degraded; or neither: its container is gone.
type health struct {
	ok     bool
	state  store.State
	reason string
}

// checkHealth checks a sandbox's container, whether it is suspended, and its
// agent. The runtime (gVisor) or the freezer (others) is the truth for
// paused: a crash may have come between recording a pause (or unpause), or
// a capture's stop, and acting on it.
func (d *Daemon) checkHealth(ctx context.Context, sb *store.Sandbox) health {
	rt, ok := d.runtimes[sb.Runtime]
	if !ok {
		return health{reason: fmt.Sprintf("its runtime %s is not available on this daemon (is its binary missing?)", sb.Runtime)}
	}
	st, err := rt.State(ctx, sb.ID)
	if gone(st, err) {
		return health{}
	}
	if err != nil {
		return health{reason: fmt.Sprintf("its runtime %s could not report its state: %v", sb.Runtime, err)}
	}
	suspended, err := d.isSuspended(ctx, sb, st)
	if err != nil {
		return health{reason: fmt.Sprintf("whether it is paused could not be read: %v", err)}
	}
	if sb.State == store.StatePaused || (sb.State == store.StateDegraded && suspended && d.userPaused(ctx, sb.ID)) {
		if !suspended {
			if err := d.suspend(ctx, sb); err != nil {
				return health{reason: fmt.Sprintf("it is recorded paused but could not be paused: %v", err)}
			}
		}
		return health{ok: true, state: store.StatePaused}
	}
	if suspended {
		if err := d.unsuspend(ctx, sb); err != nil {
			return health{reason: fmt.Sprintf("it is recorded running but could not be unpaused: %v", err)}
		}
	}
	pctx, cancel := context.WithTimeout(ctx, reconcileAgentTimeout)
	defer cancel()
	if err := agent.WaitReady(pctx, d.agent(sb)); err != nil {
		// A sandbox whose processes were killed just before may still be
		// reported running until they are reaped: asked again after the
		// wait, the runtime tells a dead sandbox from a slow agent.
		if st, serr := rt.State(ctx, sb.ID); gone(st, serr) {
			return health{}
		}
		return health{reason: fmt.Sprintf("its runtime reports it running but its agent did not answer within %s: %v", reconcileAgentTimeout, err)}
	}
	return health{ok: true, state: store.StateRunning}
}

// alive reports whether a container's processes run (frozen or not).
func alive(st runtime.State) bool {
	return st.Status == runtime.StatusRunning || st.Status == runtime.StatusPaused
}

// sweepOrphans removes host state whose sandbox is not live: state of this
// daemon only (its runtime root, netns dir, bundles, snapshots and cgroup
// parent), never another daemon's.
func (d *Daemon) sweepOrphans(ctx context.Context) error {
	recs, err := d.store.ListSandboxes(ctx, false)
	if err != nil {
		return err
	}
	live := map[string]bool{}
	for _, sb := range recs {
		live[sb.ID] = true
	}
	var errs []error
	orphan := func(id string) bool { return strings.HasPrefix(id, "sb-") && !live[id] }
	for name, rt := range d.runtimes {
		states, err := rt.List(ctx)
		if err != nil {
			errs = append(errs, err)
		}
		for _, st := range states {
			// A pre-booted sandbox's placeholder belongs to its sandbox.
			if id := strings.TrimPrefix(st.ID, podPrefix); orphan(id) {
				d.log.Warn("reconcile: removing orphan container", "sandbox", id, "container", st.ID, "runtime", name)
				if id != st.ID {
					errs = append(errs, rt.Delete(ctx, st.ID, true))
				}
				errs = append(errs, d.teardown(ctx, &store.Sandbox{ID: id, Runtime: name}))
			}
		}
	}
	ids, err := d.net.List(ctx)
	errs = append(errs, err)
	for _, id := range ids {
		if orphan(id) {
			d.log.Warn("reconcile: removing orphan network", "sandbox", id)
			errs = append(errs, d.net.Teardown(ctx, id))
		}
	}
	mps, err := mount.Under(d.bundlesDir())
	errs = append(errs, err)
	bundles := d.bundlesDir()
	if p, err := filepath.EvalSymlinks(bundles); err == nil {
		bundles = p // as mountinfo names it, which Under returns
	}
	for _, mp := range mps {
		rel, _ := filepath.Rel(bundles, mp)
		if rel == "." { // the runsc view's boundary, not a sandbox's
			continue
		}
		if id, _, _ := strings.Cut(rel, "/"); !live[id] {
			d.log.Warn("reconcile: unmounting orphan", "mount", mp)
			errs = append(errs, d.host.Unmount(ctx, mp))
		}
	}
	infos, err := d.snaps.List(ctx)
	errs = append(errs, err)
	for _, in := range infos {
		if in.Kind == snapshotActive && orphan(in.Key) {
			d.log.Warn("reconcile: removing orphan writable layer", "sandbox", in.Key)
			errs = append(errs, d.snaps.Remove(ctx, in.Key))
		}
		if in.Kind == snapshot.KindCommitted && strings.HasPrefix(in.Key, "ck-") {
			// A crash between a snapshot and its record leaves a snapshot
			// that no checkpoint names.
			if _, err := d.store.GetCheckpoint(ctx, in.Key); errdefs.IsNotFound(err) {
				d.log.Warn("reconcile: removing snapshot with no checkpoint record", "snapshot", in.Key)
				errs = append(errs, d.snaps.Remove(ctx, in.Key))
			}
		}
	}
	mems, _ := os.ReadDir(d.memImageDir(""))
	for _, e := range mems {
		if _, err := d.store.GetCheckpoint(ctx, e.Name()); errdefs.IsNotFound(err) {
			errs = append(errs, removeTree(d.memImageDir(e.Name())))
		}
	}
	// Hibernation images of sandboxes that are not live, and tombstones
	// (".rm-<id>") of removals a crash cut short: they hold what those
	// sandboxes held in memory.
	hibs, _ := os.ReadDir(d.hibernateDir(""))
	for _, e := range hibs {
		if !live[e.Name()] {
			d.log.Warn("reconcile: removing the hibernation image of a sandbox that is not live", "image", e.Name())
			errs = append(errs, removeTree(d.hibernateDir(e.Name())))
		}
	}
	// Runtime logs of sandboxes that are not live (closed by a daemon
	// that kept them, or by a crash).
	logs, _ := os.ReadDir(d.runtimeLogDir())
	for _, e := range logs {
		stem, ok := strings.CutSuffix(e.Name(), ".log")
		if id := strings.TrimPrefix(stem, podPrefix); ok && orphan(id) {
			if err := os.Remove(filepath.Join(d.runtimeLogDir(), e.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
			}
		}
	}
	entries, _ := os.ReadDir(d.bundlesDir())
	for _, e := range entries {
		if !live[e.Name()] {
			errs = append(errs, removeTree(filepath.Join(d.bundlesDir(), e.Name())))
		}
	}
	for _, name := range cgroups.Children(d.cfg.CgroupParent) {
		if orphan(name) {
			errs = append(errs, cgroups.Remove(ctx, d.cgroupPath(name)))
		}
	}
	return errors.Join(errs...)
}

func cgroupRoots() []string { return cgroups.Roots() }

// userPaused reports whether a sandbox's ledger last says a caller paused
// it (sandbox.paused after any sandbox.unpaused, and after any wake or
// restore, which leave it running). A degraded sandbox found
// suspended was either paused by its user before it degraded, or cut in a
// capture's stop; only the first stays paused.
func (d *Daemon) userPaused(ctx context.Context, id string) bool {
	evs, err := d.store.Events(ctx, id)
	if err != nil {
		return true // keep what the host shows rather than guess
	}
	for i := len(evs) - 1; i >= 0; i-- {
		switch evs[i].Type {
		case store.EventPaused:
			return true
		case store.EventUnpaused, store.EventWoken, store.EventRestored:
			return false
		}
	}
	return false
}
