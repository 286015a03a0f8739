package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/runtime"
	"github.com/forkbox/forkbox/internal/store"
)

// A held memory checkpoint (runtime.HeldCheckpointer: forkbox's runsc
// build) is a live one whose pause, save and resume are one runtime call:
// the source keeps running while that call starts, stands still from its
// pause, and the snapshot of its writable layer is taken while it is held
// after the save; the checkpoint is recorded once it runs again. It saves
// the two runtime starts of a separate pause and resume, and the checkpoint
// command's own, from the time the source stands still. A runsc without the
// feature says so before doing anything, and the checkpoint is taken the
// other way.

// checkpointMemoryHeld is checkpointMemoryLive for a running source whose
// runtime holds it. tried is false, with nothing done, when the runtime
// cannot (the caller takes the checkpoint the other way).
func (d *Daemon) checkpointMemoryHeld(ctx context.Context, sb *store.Sandbox, hc runtime.HeldCheckpointer, id, dir, tag string, flushMS float64, undo *undoStack) (_ *store.Checkpoint, downtimeMS float64, tried bool, _ error) {
	var (
		seq                int64
		heldAt, capturedAt time.Time
		captureMS          float64
	)
	h, err := hc.CheckpointHeld(ctx, sb.ID, filepath.Join(dir, memImageSub), func(paused time.Time) error {
		heldAt = time.Now()
		// What the ledger holds now is what the image holds: nothing runs.
		var err error
		if seq, err = d.store.LastSeq(ctx, sb.ID); err != nil {
			return err
		}
		err = d.snapshotMemCapture(ctx, sb, id, undo)
		capturedAt = time.Now()
		captureMS = msSinceAt(paused, capturedAt)
		return err
	})
	downtimeMS = float64(h.Stood.Microseconds()) / 1000
	if err != nil {
		if errdefs.IsNotImplemented(err) && h == (runtime.Hold{}) {
			d.log.Debug("memory checkpoint: the runtime cannot hold the source; pausing it around the save", "sandbox", sb.ID, "err", err)
			return nil, 0, false, nil
		}
		if h.Paused && !h.Resumed {
			// It may still be paused (runsc says so) or gone: recorded as it
			// is, so that the caller can unpause it or resume it from a
			// checkpoint.
			rt, rerr := d.runtimeOf(sb)
			if rerr == nil {
				rerr = d.afterFailedCheckpoint(ctx, sb, rt, store.StatePaused)
			}
			d.bestEffort(ctx, "record the source after a failed memory checkpoint", rerr, slog.String("sandbox", sb.ID))
		}
		return nil, downtimeMS, true, fmt.Errorf("memory checkpoint: %w", err)
	}
	// Recorded once the source runs again: a crash before this leaves a
	// snapshot and an image that no checkpoint names, which the next start
	// removes.
	ck := d.memCheckpoint(sb, id, tag, seq, flushMS, captureMS)
	if err := d.store.AddCheckpoint(ctx, ck); err != nil {
		return nil, downtimeMS, true, fmt.Errorf("memory checkpoint: %w", err)
	}
	undo.release() // the checkpoint owns its snapshot and image now
	// Children of this image wake up knowing the source's token: it gets a
	// new one.
	d.bestEffort(ctx, "rotate the source's agent token after a memory checkpoint", d.rotateAgentToken(ctx, sb), slog.String("sandbox", sb.ID))
	d.log.Info("memory checkpoint", "sandbox", sb.ID, "checkpoint", id, "capture_ms", ck.CaptureMS, "source_downtime_ms", downtimeMS, "live", true,
		"held", true, "save_ms", float64(h.Save.Microseconds())/1000, "snapshot_ms", msSinceAt(heldAt, capturedAt))
	return ck, downtimeMS, true, nil
}
