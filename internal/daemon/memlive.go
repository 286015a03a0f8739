package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/forkbox/forkbox/internal/runtime"
	"github.com/forkbox/forkbox/internal/store"
)

// A live memory checkpoint (gVisor's checkpoint --leave-running): the
// source is paused inside its sentry, its memory saved, its writable layer
// snapshotted while nothing runs (so the two match), and it is resumed. It
// is never torn down: it keeps its sandbox process, network stack, open
// connections and the execs in flight, which stand still for the downtime
// and go on. A paused source is saved as it is and stays paused.

// checkpointMemoryLive takes a memory checkpoint of sb (running or
// paused; the caller holds its lock) without stopping it for good, and
// returns it with the time the source stood still (ms).
func (d *Daemon) checkpointMemoryLive(ctx context.Context, sb *store.Sandbox, lc runtime.LiveCheckpointer, tag string) (_ *store.Checkpoint, downtimeMS float64, err error) {
	rt, err := d.runtimeOf(sb)
	if err != nil {
		return nil, 0, err
	}
	var undo undoStack
	defer func() {
		if err != nil {
			err = errors.Join(err, undo.run(context.WithoutCancel(ctx)))
		}
	}()
	id := newID("ck-")
	dir, flushMS, err := d.prepareMemImage(sb, id, &undo)
	if err != nil {
		return nil, 0, err
	}
	// Nothing here may stop half-way because a caller went away.
	ctx = context.WithoutCancel(ctx)
	running := sb.State == store.StateRunning
	if hc, ok := lc.(runtime.HeldCheckpointer); ok && running {
		ck, downtimeMS, tried, err := d.checkpointMemoryHeld(ctx, sb, hc, id, dir, tag, flushMS, &undo)
		if tried {
			return ck, downtimeMS, err
		}
	}
	start := time.Now()
	if running {
		if err := d.suspend(ctx, sb); err != nil {
			return nil, 0, fmt.Errorf("pause the source for its memory checkpoint: %w", err)
		}
	}
	pauseMS := msSince(start)
	ck, captureErr := d.captureLive(ctx, sb, lc, id, dir, tag, flushMS, start, &undo)
	captured := time.Now()
	var resumeErr error
	if running {
		if resumeErr = d.unsuspend(ctx, sb); resumeErr != nil {
			// It is still paused (or gone): recorded as it is, so that the
			// caller can unpause it or resume it from a checkpoint.
			d.bestEffort(ctx, "record the source after a failed resume", d.afterFailedCheckpoint(ctx, sb, rt, store.StatePaused), slog.String("sandbox", sb.ID))
			resumeErr = fmt.Errorf("memory checkpoint: the source could not be resumed (unpause it): %w", resumeErr)
		}
	}
	downtimeMS = msSince(start)
	if captureErr != nil {
		// A failed save may have taken the sentry with it.
		d.bestEffort(ctx, "record the source after a failed memory checkpoint", d.afterFailedCheckpoint(ctx, sb, rt, sb.State), slog.String("sandbox", sb.ID))
		return nil, downtimeMS, errors.Join(captureErr, resumeErr)
	}
	if resumeErr != nil {
		return nil, downtimeMS, resumeErr
	}
	// Children of this image wake up knowing the source's token: it gets
	// a new one (a paused source is unpaused for that, and paused again).
	d.bestEffort(ctx, "rotate the source's agent token after a memory checkpoint", d.rotateTokenOf(ctx, sb, running), slog.String("sandbox", sb.ID))
	d.log.Info("memory checkpoint", "sandbox", sb.ID, "checkpoint", id, "capture_ms", ck.CaptureMS, "source_downtime_ms", downtimeMS, "live", true,
		"pause_ms", pauseMS, "save_and_snapshot_ms", ck.CaptureMS-pauseMS, "resume_ms", downtimeMS-msSinceAt(start, captured))
	return ck, downtimeMS, nil
}

// captureLive saves sb's memory (left as it is: paused when the caller
// paused it) and snapshots its writable layer, and records the checkpoint.
func (d *Daemon) captureLive(ctx context.Context, sb *store.Sandbox, lc runtime.LiveCheckpointer, id, dir, tag string, flushMS float64, start time.Time, undo *undoStack) (*store.Checkpoint, error) {
	// What the ledger holds now is what the image holds: nothing runs.
	seq, err := d.store.LastSeq(ctx, sb.ID)
	if err != nil {
		return nil, err
	}
	if err := lc.CheckpointLive(ctx, sb.ID, filepath.Join(dir, memImageSub)); err != nil {
		return nil, fmt.Errorf("memory checkpoint: %w", err)
	}
	ck, err := d.recordMemCapture(ctx, sb, id, tag, seq, flushMS, start, undo)
	if err != nil {
		return nil, err
	}
	undo.release() // the checkpoint owns its snapshot and image now
	return ck, nil
}

// recordMemCapture snapshots sb's writable layer as checkpoint id, whose
// memory image is saved, and records the checkpoint (seq: the ledger's last
// event, read while nothing ran). Its undo goes on undo.
func (d *Daemon) recordMemCapture(ctx context.Context, sb *store.Sandbox, id, tag string, seq int64, flushMS float64, start time.Time, undo *undoStack) (*store.Checkpoint, error) {
	if err := d.snapshotMemCapture(ctx, sb, id, undo); err != nil {
		return nil, err
	}
	ck := d.memCheckpoint(sb, id, tag, seq, flushMS, msSince(start))
	if err := d.store.AddCheckpoint(ctx, ck); err != nil {
		return nil, err
	}
	return ck, nil
}

// snapshotMemCapture snapshots sb's writable layer as checkpoint id's (its
// removal pushed on undo). A crash before the checkpoint's record leaves a
// snapshot that the next start removes (sweepOrphans).
func (d *Daemon) snapshotMemCapture(ctx context.Context, sb *store.Sandbox, id string, undo *undoStack) error {
	if err := d.snaps.Commit(ctx, id, sb.ID); err != nil {
		return fmt.Errorf("memory checkpoint: snapshot: %w", err)
	}
	undo.push(func(ctx context.Context) error { return d.snaps.Remove(ctx, id) })
	return nil
}

// memCheckpoint is the record of memory checkpoint id of sb.
func (d *Daemon) memCheckpoint(sb *store.Sandbox, id, tag string, seq int64, flushMS, captureMS float64) *store.Checkpoint {
	return &store.Checkpoint{ID: id, SandboxID: sb.ID, Tag: tag, Kind: KindMemory, LedgerSeq: seq, Image: sb.Image, ImageDigest: sb.ImageDigest,
		Runtime: sb.Runtime, Config: sb.Config, CaptureMS: captureMS, FlushMS: flushMS, Size: -1}
}

// rotateTokenOf rotates sb's agent token; a sandbox that is not running is
// unpaused for it and paused again.
func (d *Daemon) rotateTokenOf(ctx context.Context, sb *store.Sandbox, running bool) error {
	if running {
		return d.rotateAgentToken(ctx, sb)
	}
	if err := d.unsuspend(ctx, sb); err != nil {
		return err
	}
	rerr := d.rotateAgentToken(ctx, sb)
	if err := d.suspend(ctx, sb); err != nil {
		d.recordState(ctx, sb, store.StateRunning, "")
		return errors.Join(rerr, fmt.Errorf("pause again: %w", err))
	}
	return rerr
}

// msSinceAt is the time from start to t in milliseconds.
func msSinceAt(start, t time.Time) float64 { return float64(t.Sub(start).Microseconds()) / 1000 }
