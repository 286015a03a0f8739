package daemon

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/store"
)

// KindFilesystem is what a filesystem checkpoint captures: the sandbox's
// writable layer (processes restart in children).
const KindFilesystem = "filesystem"

const maxTagBytes = 256

// Checkpoint captures a live sandbox's filesystem as an immutable snapshot
// and records sandbox.checkpoint_created in its ledger before returning.
func (d *Daemon) Checkpoint(ctx context.Context, idOrName, tag string) (*store.Checkpoint, error) {
	return d.CheckpointWith(ctx, idOrName, tag, false)
}

// CheckpointWith is Checkpoint, with memory and processes too when memory
// is set (gVisor only; the source is restored in place).
func (d *Daemon) CheckpointWith(ctx context.Context, idOrName, tag string, memory bool) (*store.Checkpoint, error) {
	if len(tag) > maxTagBytes {
		return nil, fmt.Errorf("tag is %d bytes, more than %d: %w", len(tag), maxTagBytes, errdefs.ErrInvalidArgument)
	}
	sb, err := d.store.GetSandbox(ctx, idOrName)
	if err != nil {
		return nil, err
	}
	unlock := d.lock(sb.ID)
	defer unlock()
	if sb, err = d.live(ctx, sb.ID); err != nil {
		return nil, err
	}
	if memory {
		if sb.State == store.StateHibernated {
			return nil, fmt.Errorf("sandbox %s is hibernated: wake it to take a memory checkpoint: %w", sb.ID, errdefs.ErrFailedPrecondition)
		}
		ck, _, err := d.checkpointMemoryLocked(ctx, sb, tag, false)
		return ck, err
	}
	return d.checkpointLocked(ctx, sb, tag)
}

// checkpointDisposable takes a memory checkpoint of a running sandbox that
// nothing needs afterwards (an environment's builder): it is closed by it
// rather than restored in place.
func (d *Daemon) checkpointDisposable(ctx context.Context, idOrName, tag string) (*store.Checkpoint, error) {
	sb, err := d.store.GetSandbox(ctx, idOrName)
	if err != nil {
		return nil, err
	}
	unlock := d.lock(sb.ID)
	defer unlock()
	if sb, err = d.live(ctx, sb.ID); err != nil {
		return nil, err
	}
	if err := requireState(sb, "take a memory checkpoint of", store.StateRunning); err != nil {
		return nil, err
	}
	ck, _, err := d.checkpointMemoryLocked(ctx, sb, tag, true)
	return ck, err
}

// checkpointLocked takes the checkpoint; the caller holds the sandbox lock.
// A running sandbox is stopped for the snapshot (stopForCapture) and
// resumed right after; a
// paused one stays paused. The snapshot is an O(1) btrfs snapshot of the
// writable layer, so the capture does not grow with the data written.
func (d *Daemon) checkpointLocked(ctx context.Context, sb *store.Sandbox, tag string) (ck *store.Checkpoint, err error) {
	id := newID("ck-")
	// Write back what the sandbox wrote before freezing it: a btrfs
	// snapshot flushes the subvolume's dirty data, and doing that inside
	// the frozen window would make the capture grow with the data.
	flushStart := time.Now()
	if err := syncFS(d.rootfsDir(sb.ID)); err != nil {
		return nil, fmt.Errorf("flush before checkpoint: %w", err)
	}
	flushMS := msSince(flushStart)
	start := time.Now()
	if sb.State == store.StateRunning {
		resume, err := d.stopForCapture(ctx, sb)
		if err != nil {
			return nil, fmt.Errorf("stop for checkpoint: %w", err)
		}
		defer func() {
			if rerr := resume(context.WithoutCancel(ctx)); rerr != nil {
				err = errors.Join(err, fmt.Errorf("resume after checkpoint: %w", rerr))
			}
		}()
	}
	// What the ledger holds now is what the frozen snapshot holds: an exec
	// recorded from here on runs after the thaw, and Resume replays it.
	seq, err := d.store.LastSeq(ctx, sb.ID)
	if err != nil {
		return nil, err
	}
	if err := d.snaps.Commit(ctx, id, sb.ID); err != nil {
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	ck = &store.Checkpoint{ID: id, SandboxID: sb.ID, Tag: tag, Kind: KindFilesystem, Image: sb.Image, LedgerSeq: seq,
		ImageDigest: sb.ImageDigest, Runtime: sb.Runtime, Config: sb.Config, CaptureMS: msSince(start), FlushMS: flushMS, Size: -1}
	if err := d.store.AddCheckpoint(ctx, ck); err != nil {
		return nil, errors.Join(err, d.snaps.Remove(context.WithoutCancel(ctx), id))
	}
	d.log.Info("checkpoint", "sandbox", sb.ID, "checkpoint", id, "tag", tag, "capture_ms", ck.CaptureMS, "flush_ms", flushMS)
	return ck, nil
}

// ListCheckpoints lists a sandbox's checkpoints (closed sandboxes too),
// oldest first, with their sizes.
func (d *Daemon) ListCheckpoints(ctx context.Context, idOrName string) ([]*store.Checkpoint, error) {
	sb, err := d.store.GetSandbox(ctx, idOrName)
	if err != nil {
		return nil, err
	}
	cks, err := d.store.ListCheckpoints(ctx, sb.ID)
	if err != nil {
		return nil, err
	}
	for _, ck := range cks {
		if n, err := d.snaps.Usage(ctx, ck.ID); err == nil {
			ck.Size = n
		}
	}
	return cks, nil
}

// ListCheckpointsPage is one page of ListCheckpoints, with the token of
// the next ("" after the last).
func (d *Daemon) ListCheckpointsPage(ctx context.Context, idOrName string, p store.Page) ([]*store.Checkpoint, string, error) {
	sb, err := d.store.GetSandbox(ctx, idOrName)
	if err != nil {
		return nil, "", err
	}
	cks, next, err := d.store.ListCheckpointsPage(ctx, sb.ID, p)
	if err != nil {
		return nil, "", err
	}
	for _, ck := range cks {
		if n, err := d.snaps.Usage(ctx, ck.ID); err == nil {
			ck.Size = n
		}
	}
	return cks, next, nil
}

// GetCheckpoint returns one checkpoint.
func (d *Daemon) GetCheckpoint(ctx context.Context, id string) (*store.Checkpoint, error) {
	return d.store.GetCheckpoint(ctx, id)
}

// DeleteCheckpoint deletes a checkpoint and its snapshot. Sandboxes started
// from it are unaffected (their layers are independent copies). An
// environment's snapshot is deleted with its environment, not here.
func (d *Daemon) DeleteCheckpoint(ctx context.Context, id string) error {
	if env, err := d.store.IsEnvSnapshot(ctx, id); err != nil {
		return err
	} else if env {
		return fmt.Errorf("checkpoint %s is an environment's snapshot: delete the environment instead: %w", id, errdefs.ErrFailedPrecondition)
	}
	return d.deleteCheckpoint(ctx, id)
}

func (d *Daemon) deleteCheckpoint(ctx context.Context, id string) error {
	ck, err := d.store.GetCheckpoint(ctx, id)
	if err != nil {
		return err
	}
	if err := d.store.DeleteCheckpoint(ctx, ck.ID); err != nil {
		return err
	}
	d.note(ctx, ck.SandboxID, store.EventCheckpointDeleted, map[string]any{"snapshot": ck.ID, "tag": ck.Tag})
	if err := d.snaps.Remove(ctx, ck.ID); err != nil && !errdefs.IsNotFound(err) {
		return err
	}
	return removeTree(d.memImageDir(ck.ID))
}

// syncFS writes back the dirty data of the filesystem holding dir.
func syncFS(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return unix.Syncfs(int(f.Fd()))
}

// stopForCapture stops a running sandbox so that a capture is consistent
// (suspend: gVisor inside its own kernel, others with the freezer), and
// returns what starts it again.
func (d *Daemon) stopForCapture(ctx context.Context, sb *store.Sandbox) (func(context.Context) error, error) {
	if err := d.suspend(ctx, sb); err != nil {
		return nil, err
	}
	return func(ctx context.Context) error { return d.unsuspend(ctx, sb) }, nil
}
