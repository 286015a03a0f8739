package daemon

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/agent"
	"github.com/forkbox/forkbox/internal/cgroups"
	"github.com/forkbox/forkbox/internal/mount"
	"github.com/forkbox/forkbox/internal/snapshot"
	"github.com/forkbox/forkbox/internal/store"
)

// reconcile makes the host agree with the store after a start or a crash:
//   - a sandbox recorded running whose container runs and whose agent
//     answers is kept;
//   - any other sandbox that is not closed (creating, closing, failed, or
//     running but dead) is torn down and recorded closed;
//   - containers, netns, mounts, writable layers, cgroups and bundles that
//     belong to no live sandbox are removed.
func (d *Daemon) reconcile(ctx context.Context) error {
	recs, err := d.store.ListSandboxes(ctx, false)
	if err != nil {
		return err
	}
	var errs []error
	for _, sb := range recs {
		if sb.State == store.StateHibernating || sb.State == store.StateHibernated {
			// A whole image is a hibernated sandbox (a crash may have come
			// before the state was recorded); a running container means the
			// checkpoint never finished.
			if d.hibernationComplete(sb.ID) {
				if sb.State == store.StateHibernating {
					if rt, ok := d.runtimes[sb.Runtime]; ok {
						rt.Delete(ctx, sb.ID, true)
					}
					d.store.SetSandboxState(ctx, sb.ID, store.StateHibernated, "")
				}
				d.log.Info("reconcile: sandbox hibernated", "sandbox", sb.ID)
				continue
			}
			sb.State = store.StateRunning
			d.store.SetSandboxState(ctx, sb.ID, store.StateRunning, "")
		}
		if (sb.State == store.StateRunning || sb.State == store.StatePaused) && d.alive(ctx, sb) {
			d.store.AppendEvent(ctx, sb.ID, store.EventSandboxFound, nil)
			d.log.Info("reconcile: sandbox still running", "sandbox", sb.ID)
			continue
		}
		d.log.Warn("reconcile: cleaning sandbox", "sandbox", sb.ID, "state", sb.State)
		if sb.State == store.StateRunning || sb.State == store.StatePaused {
			d.store.AppendEvent(ctx, sb.ID, store.EventSandboxLost, map[string]any{"reason": "not running after daemon restart"})
		}
		if err := d.teardown(ctx, sb); err != nil {
			errs = append(errs, err)
			d.store.SetSandboxState(ctx, sb.ID, store.StateFailed, err.Error())
			continue
		}
		msg := sb.Error
		if msg == "" {
			msg = "cleaned by reconcile (was " + sb.State + ")"
		}
		d.store.SetSandboxState(ctx, sb.ID, store.StateClosed, msg)
		d.store.AppendEvent(ctx, sb.ID, store.EventSandboxClosed, map[string]any{"reason": msg})
	}
	return errors.Join(errs...)
}

// alive reports whether a sandbox's container runs and its agent answers.
func (d *Daemon) alive(ctx context.Context, sb *store.Sandbox) bool {
	rt, ok := d.runtimes[sb.Runtime]
	if !ok {
		return false
	}
	st, err := rt.State(ctx, sb.ID)
	if err != nil || (st.Status != "running" && st.Status != "paused") {
		return false
	}
	// The freezer is the truth for paused: a crash may have come between
	// recording a pause (or unpause) and acting on it.
	frozen, err := cgroups.Frozen(d.cgroupPath(sb.ID))
	if err != nil {
		return false
	}
	if sb.State == store.StatePaused {
		if !frozen {
			err = cgroups.Freeze(ctx, d.cgroupPath(sb.ID))
		}
		return err == nil
	}
	if frozen {
		if err := cgroups.Thaw(ctx, d.cgroupPath(sb.ID)); err != nil {
			return false
		}
	}
	pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	return agent.WaitReady(pctx, d.agent(sb)) == nil
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
			if orphan(st.ID) {
				d.log.Warn("reconcile: removing orphan container", "sandbox", st.ID, "runtime", name)
				errs = append(errs, d.teardown(ctx, &store.Sandbox{ID: st.ID, Runtime: name}))
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
	for _, mp := range mps {
		rel, _ := filepath.Rel(d.bundlesDir(), mp)
		if id, _, _ := strings.Cut(rel, "/"); !live[id] {
			d.log.Warn("reconcile: unmounting orphan", "mount", mp)
			errs = append(errs, mount.Unmount(ctx, mp))
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
	mems, _ := os.ReadDir(filepath.Join(d.cfg.StateDir, "memimages"))
	for _, e := range mems {
		if _, err := d.store.GetCheckpoint(ctx, e.Name()); errdefs.IsNotFound(err) {
			errs = append(errs, removeTree(d.memImageDir(e.Name())))
		}
	}
	entries, _ := os.ReadDir(d.bundlesDir())
	for _, e := range entries {
		if !live[e.Name()] {
			errs = append(errs, removeTree(filepath.Join(d.bundlesDir(), e.Name())))
		}
	}
	for _, root := range cgroupRoots() {
		cg, _ := os.ReadDir(filepath.Join(root, d.cfg.CgroupParent))
		for _, e := range cg {
			if e.IsDir() && orphan(e.Name()) {
				errs = append(errs, removeCgroups(d.cgroupPath(e.Name())))
			}
		}
	}
	return errors.Join(errs...)
}

func cgroupRoots() []string {
	roots, _ := filepath.Glob("/sys/fs/cgroup/*")
	return append(roots, "/sys/fs/cgroup")
}
