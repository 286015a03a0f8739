package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/agent"
	"github.com/forkbox/forkbox/internal/cgroups"
	"github.com/forkbox/forkbox/internal/image"
	"github.com/forkbox/forkbox/internal/network"
	"github.com/forkbox/forkbox/internal/runtime"
	"github.com/forkbox/forkbox/internal/runtime/runsc"
	"github.com/forkbox/forkbox/internal/runtime/spec"
	"github.com/forkbox/forkbox/internal/store"
)

// Memory checkpoints (gVisor): the sandbox's memory and processes are saved
// with its filesystem, and sandboxes started from the checkpoint continue
// the source's processes where they were. The source is paused for the
// save and the snapshot of its writable layer and then resumed (memlive.go);
// a runtime that cannot leave it running stops it for the checkpoint and
// restores it in place at once (it keeps its ID, address and token). An
// environment's builder is disposable: it is closed by its checkpoint.
//
// A child restores the same memory image over its own writable snapshot,
// in its own netns with its own address (gVisor reads the netns again on
// restore), with its own hostname and machine-id. Its agent wakes with the
// source's token and is told at once that it was forked: it takes a new
// token and runs the user's on-fork hook. What a memory fork cannot change
// are values already in process memory (seeds, tokens, UUIDs, open
// connections): see the agent's package doc.

// KindMemory is what a memory checkpoint captures.
const KindMemory = "filesystem+memory"

const memImageSub = "mem"

// imageTokenFile holds, beside a memory image, the agent token in it.
const imageTokenFile = "agent-token"

func (d *Daemon) memImageDir(ckID string) string {
	mem, _ := d.imageRoots()
	return filepath.Join(mem, ckID)
}

// prepareMemImage makes the image dir of memory checkpoint id (its removal
// pushed on undo), flushes what sb wrote, and keeps sb's spec and agent
// token beside the image. It returns the dir and the flush's time (ms).
func (d *Daemon) prepareMemImage(sb *store.Sandbox, id string, undo *undoStack) (string, float64, error) {
	dir := d.memImageDir(id)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", 0, err
	}
	undo.push(func(context.Context) error { return removeTree(dir) })
	flushStart := time.Now()
	if err := syncFS(d.rootfsDir(sb.ID)); err != nil {
		return "", 0, fmt.Errorf("flush before checkpoint: %w", err)
	}
	flushMS := msSince(flushStart)
	// The spec children adapt: kept with the image, as the source's bundle
	// goes when the source closes.
	cfgJSON, err := os.ReadFile(filepath.Join(d.bundleDir(sb.ID), "config.json"))
	if err == nil {
		err = os.WriteFile(filepath.Join(dir, "config.json"), cfgJSON, 0o600)
	}
	if err == nil && d.pooled(sb.ID) {
		// The placeholder is in the image too: children restore it first.
		err = copyFile(filepath.Join(d.podBundleDir(sb.ID), "config.json"), filepath.Join(dir, podSpecFile))
	}
	if err == nil {
		// The token the image's agent holds: children are reached with it
		// (the source's own is rotated after the checkpoint).
		err = os.WriteFile(filepath.Join(dir, imageTokenFile), []byte(sb.AgentToken), 0o600)
	}
	if err != nil {
		return "", 0, fmt.Errorf("keep the source's spec: %w", err)
	}
	return dir, flushMS, nil
}

// checkpointMemoryLocked takes a memory checkpoint of sb (running or
// paused; the caller holds its lock) and returns it with how long the
// source stood still (ms). Where the runtime can (gVisor's leave-running)
// the source is only paused around the save and the snapshot of its
// writable layer (checkpointMemoryLive); else it stops for the checkpoint
// and is restored in place. A disposable source (an environment's
// builder) is closed instead.
func (d *Daemon) checkpointMemoryLocked(ctx context.Context, sb *store.Sandbox, tag string, disposable bool) (_ *store.Checkpoint, downtimeMS float64, err error) {
	mc, rt, err := d.memoryRuntime(sb)
	if err != nil {
		return nil, 0, err
	}
	if lc, ok := rt.(runtime.LiveCheckpointer); ok && !disposable {
		return d.checkpointMemoryLive(ctx, sb, lc, tag)
	}
	ck, err := d.checkpointMemoryStop(ctx, sb, mc, rt, tag, disposable)
	return ck, 0, err
}

// checkpointMemoryStop is a memory checkpoint that stops the source: it is
// restored in place from the image at once (it keeps its ID, address and
// token), or closed when disposable.
func (d *Daemon) checkpointMemoryStop(ctx context.Context, sb *store.Sandbox, mc runtime.MemoryCheckpointer, rt runtime.Runtime, tag string, disposable bool) (_ *store.Checkpoint, err error) {
	var undo undoStack
	defer func() {
		if err != nil {
			err = errors.Join(err, undo.run(context.WithoutCancel(ctx)))
		}
	}()
	if sb.State == store.StatePaused {
		// gVisor checkpoints a running sandbox: unpaused for it, paused
		// again after it, whatever happens (unless the source failed).
		if err := d.unsuspend(ctx, sb); err != nil {
			return nil, err
		}
		defer func() {
			if sb.State != store.StatePaused {
				return
			}
			if ferr := d.suspend(context.WithoutCancel(ctx), sb); ferr != nil {
				// It runs: recorded so, rather than paused in name only.
				d.bestEffort(ctx, "pause again after a memory checkpoint", ferr, slog.String("sandbox", sb.ID))
				d.recordState(context.WithoutCancel(ctx), sb, store.StateRunning, "")
			}
		}()
	}
	id := newID("ck-")
	dir, flushMS, err := d.prepareMemImage(sb, id, &undo)
	if err != nil {
		return nil, err
	}
	// Nothing here may stop half-way because a caller went away.
	ctx = context.WithoutCancel(ctx)
	start := time.Now()
	seq, err := d.store.LastSeq(ctx, sb.ID)
	if err != nil {
		return nil, err
	}
	d.dropAgent(sb.ID) // no child may wake holding the source's session (agents.go)
	if err := mc.Checkpoint(ctx, sb.ID, filepath.Join(dir, memImageSub)); err != nil {
		d.bestEffort(ctx, "record the source after a failed memory checkpoint", d.afterFailedCheckpoint(ctx, sb, rt, sb.State), slog.String("sandbox", sb.ID))
		return nil, fmt.Errorf("memory checkpoint: %w", err)
	}
	// Nothing runs now: the snapshot matches the memory image exactly, and
	// it is recorded before the source is brought back, so a failure (or a
	// crash) there leaves a checkpoint to resume the source from.
	var ck *store.Checkpoint
	captureErr := d.snaps.Commit(ctx, id, sb.ID)
	captureMS := msSince(start)
	if captureErr == nil {
		undo.push(func(ctx context.Context) error { return d.snaps.Remove(ctx, id) })
		ck = &store.Checkpoint{ID: id, SandboxID: sb.ID, Tag: tag, Kind: KindMemory, LedgerSeq: seq, Image: sb.Image, ImageDigest: sb.ImageDigest,
			Runtime: sb.Runtime, Config: sb.Config, CaptureMS: captureMS, FlushMS: flushMS, Size: -1}
		captureErr = d.store.AddCheckpoint(ctx, ck)
	}
	if captureErr == nil {
		undo.release() // the checkpoint owns its snapshot and image now
	}
	if disposable {
		if captureErr != nil {
			return nil, fmt.Errorf("memory checkpoint: %w", captureErr)
		}
		// Nothing restores it: it is closed now, its image kept for the
		// checkpoint's children.
		if derr := d.deleteLocked(ctx, sb); derr != nil {
			d.bestEffort(ctx, "close a disposable sandbox after its memory checkpoint", derr, slog.String("sandbox", sb.ID))
		}
		d.log.Info("memory checkpoint of a disposable sandbox", "sandbox", sb.ID, "checkpoint", id, "capture_ms", captureMS)
		return ck, nil
	}
	// The source is brought back in any case (from the image, which the
	// undo stack removes only after this).
	if rerr := d.deleteContainers(ctx, sb); rerr != nil {
		d.recordState(ctx, sb, store.StateFailed, rerr.Error())
		return nil, errors.Join(captureErr, fmt.Errorf("memory checkpoint: the stopped source could not be released: %w", rerr))
	}
	rerr := d.net.Reconfigure(ctx, sb.ID, netip.MustParseAddr(sb.IP))
	if rerr == nil {
		rerr = d.restoreAsItself(ctx, sb, mc, filepath.Join(dir, memImageSub))
	}
	if rerr != nil {
		d.recordState(ctx, sb, store.StateFailed, rerr.Error())
		return nil, errors.Join(captureErr, fmt.Errorf("memory checkpoint: the source could not be restored (resume it from its last checkpoint): %w", rerr))
	}
	if captureErr != nil {
		return nil, fmt.Errorf("memory checkpoint: %w", captureErr)
	}
	// Children of this image wake up knowing the source's token.
	if rerr := d.rotateAgentToken(ctx, sb); rerr != nil {
		d.log.Warn("memory checkpoint: the source's agent token was not rotated", "sandbox", sb.ID, "err", rerr)
	}
	d.log.Info("memory checkpoint", "sandbox", sb.ID, "checkpoint", id, "capture_ms", captureMS, "source_downtime_ms", msSince(start))
	return ck, nil
}

// rotateTimeout bounds a token rotation: its callers hold the sandbox's
// lock, often with a context that cannot end, and an agent that takes the
// request and never answers must not keep that lock (and the loops that
// wait for it: idle hibernation, expiry, the pre-boot refill) forever.
var rotateTimeout = 10 * time.Second

// forkNoticeTimeout bounds a memory child's fork notice: the on-fork hook
// (agent.DefaultForkHookTimeout at most) and the agent's own work.
var forkNoticeTimeout = agent.DefaultForkHookTimeout + readyTimeout

// rotateAgentToken gives sb's agent a new token: the agent accepts old and
// new until the first call with the new one, which follows the record, so a
// crash in between leaves the recorded token working. It gives up after
// rotateTimeout (DeadlineExceeded); the recorded token is then the old or
// the new one, and the client holds it.
func (d *Daemon) rotateAgentToken(ctx context.Context, sb *store.Sandbox) error {
	ctx, cancel := context.WithTimeout(ctx, rotateTimeout)
	defer cancel()
	tok := randomHex(16)
	c := d.agent(sb)
	if err := c.RotateToken(ctx, tok); err != nil {
		return err
	}
	if err := d.store.SetAgentToken(ctx, sb.ID, tok); err != nil {
		return err
	}
	sb.AgentToken = tok
	_, err := c.Ping(ctx) // the first use: from now on only tok is accepted
	return err
}

// restoreAsItself restores sb from a memory image into its own bundle,
// netns and address, and waits for its agent. gVisor took eth0's address
// over: the caller puts it back first (wake attaches the network again,
// a memory checkpoint's source reconfigures it). Used by wake and by a
// memory checkpoint's source.
func (d *Daemon) restoreAsItself(ctx context.Context, sb *store.Sandbox, mc runtime.MemoryCheckpointer, image string) error {
	pooled := d.pooled(sb.ID)
	cgBundle := d.bundleDir(sb.ID) // the restore that makes the cgroup
	if pooled {
		cgBundle = d.podBundleDir(sb.ID)
	}
	if err := d.restoreCPUIn(ctx, cgBundle, sb); err != nil {
		return err
	}
	if pooled {
		if err := mc.Restore(ctx, podID(sb.ID), d.podBundleDir(sb.ID), image); err != nil {
			return fmt.Errorf("restore the placeholder: %w", err)
		}
	}
	if err := mc.Restore(ctx, sb.ID, d.bundleDir(sb.ID), image); err != nil {
		return err
	}
	rctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	err := agent.WaitReady(rctx, d.agent(sb))
	return errors.Join(err, d.settleCPU(sb)) // also when its agent does not answer
}

// restoreIntoCreated restores a memory image's placeholder into sb's created
// one (a pre-booted member of the created kind) and reports whether it did.
// If it did not (the member's sandbox died while it waited, or runsc was
// upgraded since it was created and refuses an image of the new build), the
// member is deleted, the caller restores the ordinary way, and the fork goes
// on.
func (d *Daemon) restoreIntoCreated(ctx context.Context, sb *store.Sandbox, mc runtime.MemoryCheckpointer, image string) bool {
	c, ok := mc.(creator)
	if !ok {
		return false
	}
	err := c.RestoreCreated(ctx, podID(sb.ID), d.podBundleDir(sb.ID), image)
	if err == nil {
		return true
	}
	d.log.Warn("memory child: the created placeholder did not take the image; restoring the ordinary way", "sandbox", sb.ID, "err", err)
	d.bestEffort(ctx, "delete the created placeholder", d.runtimes[sb.Runtime].Delete(ctx, podID(sb.ID), true), slog.String("sandbox", sb.ID))
	return false
}

// startFromMemory starts sb by restoring a memory checkpoint over its own
// writable snapshot, netns and identity, and tells its agent it was forked.
// With pm (a created member, takeCreated) sb is that pre-booted sandbox: its
// network is made and its placeholder created, and the image's placeholder
// is restored into it, skipping the boot.
func (d *Daemon) startFromMemory(ctx context.Context, sb *store.Sandbox, img image.Image, ck *store.Checkpoint, pm *prebooted) error {
	mc, _, err := d.memoryRuntime(sb)
	if err != nil {
		return err
	}
	dir := d.memImageDir(ck.ID)
	// The child's agent wakes with the token its image holds: reach it with
	// that, and give it its own. (Images of older daemons have no token
	// file: their source's recorded token is the image's.) The source may
	// be closed by now (an environment's builder).
	tok := ""
	if b, err := readSmall(filepath.Join(dir, imageTokenFile), 4096); err == nil && len(b) > 0 {
		tok = string(b)
	} else {
		src, err := d.store.GetSandbox(ctx, ck.SandboxID)
		if err != nil {
			return err
		}
		tok = src.AgentToken
	}
	s, err := spec.ReadRestoreBundle(dir)
	if err != nil {
		return fmt.Errorf("the memory checkpoint's spec: %w", err)
	}
	t0 := time.Now()
	var nw *network.Network
	if pm != nil {
		nw, err = pm.nw, d.prepareRootfs(ctx, sb, img, ck.ID)
	} else {
		nw, err = d.prepare(ctx, sb, img, ck.ID)
	}
	if err != nil {
		return err
	}
	prepareMS := msSince(t0)
	// The spec must keep the source's args, cwd and mount list; sources,
	// hostname, netns, cgroup and limits are the child's.
	bundle := d.bundleDir(sb.ID)
	if _, err := writeIdentity(bundle, sb, nw); err != nil {
		return err
	}
	if err := d.ownMounts(s, d.rootfsDir(sb.ID), bundle); err != nil {
		return fmt.Errorf("the memory checkpoint's spec: %v: %w", err, errdefs.ErrFailedPrecondition)
	}
	s.Hostname = sb.Config.Hostname
	for i := range s.Linux.Namespaces {
		if s.Linux.Namespaces[i].Type == "network" {
			s.Linux.Namespaces[i].Path = nw.NSPath
		}
	}
	pod, err := d.readPodSpec(dir)
	if err != nil {
		return err
	}
	if pod != nil {
		// The source ran in a pre-booted sandbox: its placeholder is
		// restored first, as this sandbox's, which holds the cgroup.
		runsc.AsTenant(s, podID(sb.ID))
		s.Linux.CgroupsPath = "" // the placeholder holds the cgroup (bundle.go)
		ownAppMemoryLimit(s, sb) // the child's, as bundle.go gives a tenant
		if pm == nil {
			if err := d.writeRestoredPod(ctx, sb, pod, nw.NSPath); err != nil {
				return err
			}
		}
	} else {
		d.ownCgroup(ctx, s, sb)
	}
	if err := spec.WriteBundle(bundle, s); err != nil {
		return err
	}
	t1 := time.Now()
	if pm != nil {
		d.raiseCPU(ctx, sb) // its cgroup is the created placeholder's
	}
	if pm != nil && !d.restoreIntoCreated(ctx, sb, mc, filepath.Join(dir, memImageSub)) {
		// The ordinary way, in the member's netns and cgroup.
		if err := d.writeRestoredPod(ctx, sb, pod, nw.NSPath); err != nil {
			return err
		}
		pm = nil
	}
	switch {
	case pm != nil:
	case pod != nil:
		if err := mc.Restore(ctx, podID(sb.ID), d.podBundleDir(sb.ID), filepath.Join(dir, memImageSub)); err != nil {
			return fmt.Errorf("restore the memory image's placeholder: %w", err)
		}
	}
	if err := mc.Restore(ctx, sb.ID, bundle, filepath.Join(dir, memImageSub)); err != nil {
		return fmt.Errorf("restore the memory image: %w", err)
	}
	restoreMS := msSince(t1)
	t2 := time.Now()
	c := d.agentWithToken(sb, tok)
	rctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	if err := agent.WaitReady(rctx, c); err != nil {
		return fmt.Errorf("restored agent did not answer (%v); its output: %q: %w", err, d.initOutput(sb.ID), errdefs.ErrUnavailable)
	}
	readyMS := msSince(t2)
	if err := d.settleCPU(sb); err != nil { // before the on-fork hook: that is the tenant's
		return err
	}
	t3 := time.Now()
	// Bounded: a pool's refill calls this with a context that never ends,
	// holding the child's lock and a live slot.
	nctx, ncancel := context.WithTimeout(ctx, forkNoticeTimeout)
	defer ncancel()
	reply, err := c.Forked(nctx, agent.ForkNotice{Token: sb.AgentToken, Hostname: sb.Config.Hostname, MachineID: sb.Config.MachineID,
		ParentID: ck.SandboxID, Reason: agent.ForkReasonFork, Time: time.Now()})
	if err != nil {
		return fmt.Errorf("tell the child it was forked: %w", err)
	}
	hostnameExec := pod != nil && !reply.HostnameSet
	if hostnameExec {
		// gVisor keeps the image's hostname, which the source's
		// placeholder set, and the agent could not reach the restored
		// placeholder's hostname service (an image of an older build): the
		// placeholder is told with runsc exec, as at a pre-booted start
		// (about 300 ms on a slow host, against a few ms for the service).
		if err := d.setPodHostname(ctx, sb); err != nil {
			return err
		}
	}
	// Where a child's start goes (bench and issue 17): our own work before
	// (snapshot, mounts, network, bundle), runsc restore, the agent's first
	// answer, the fork notice; and how long its CPU limit held it back
	// (cpu_throttled_ms; -1: not read).
	if d.log.Enabled(ctx, slog.LevelDebug) {
		throttled := -1.0
		if t, err := cgroups.CPUThrottled(cgroups.Root, d.cgroupPath(sb.ID)); err == nil {
			throttled = float64(t.Microseconds()) / 1000
		}
		d.log.Debug("memory child started", "sandbox", sb.ID, "checkpoint", ck.ID, "prepare_ms", prepareMS, "restore_ms", restoreMS,
			"agent_ready_ms", readyMS, "fork_notice_ms", msSince(t3), "hostname_exec", hostnameExec, "total_ms", msSince(t0),
			"cpu_throttled_ms", throttled)
	}
	data := map[string]any{"hook_ran": reply.HookRan, "clock_skew_ms": reply.ClockSkew.Milliseconds()}
	if reply.HookRan {
		data["hook_exit_code"] = reply.HookExitCode
		data["hook_output"] = reply.HookOutput
	}
	d.note(ctx, sb.ID, store.EventForkNotified, data)
	return nil
}
