package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/forkbox/forkbox/errdefs"
)

// Checkpoint is the record of one immutable snapshot of a sandbox, with
// what a sandbox started from it inherits.
type Checkpoint struct {
	ID          string
	SandboxID   string
	Tag         string
	Kind        string
	Image       string
	ImageDigest string
	Runtime     string
	Config      SandboxConfig
	Size        int64
	// CaptureMS is the frozen window: freeze + snapshot + thaw.
	CaptureMS float64
	// FlushMS is the writeback of the sandbox's dirty data before the
	// freeze (the sandbox keeps running meanwhile).
	FlushMS float64
	// LedgerSeq is the last ledger event of the source that the snapshot
	// holds the effects of (taken while it was frozen; 0 = the
	// checkpoint_created event's own): execs after it are what Resume
	// replays.
	LedgerSeq int64
	CreatedAt time.Time
}

const checkpointCols = `id, sandbox_id, tag, kind, image, image_digest, runtime, config, size, capture_ms, ledger_seq, created_at, flush_ms`

// AddCheckpoint records a checkpoint and appends sandbox.checkpoint_created
// to the source's ledger, in one transaction.
func (s *Store) AddCheckpoint(ctx context.Context, ck *Checkpoint) error {
	wctx := writeCtx(ctx) // its writes: see writeCtx
	cfg, err := json.Marshal(ck.Config)
	if err != nil {
		return fmt.Errorf("store: %w", err)
	}
	tx, err := s.db.BeginTx(wctx, nil)
	if err != nil {
		return fmt.Errorf("store: %w", err)
	}
	defer tx.Rollback()
	ck.CreatedAt = time.Now()
	data, _ := json.Marshal(map[string]any{"tag": ck.Tag, "snapshot": ck.ID, "kind": ck.Kind, "capture_ms": ck.CaptureMS, "flush_ms": ck.FlushMS})
	res, err := tx.ExecContext(wctx, `INSERT INTO events (sandbox_id, type, time, data) VALUES (?,?,?,?)`,
		ck.SandboxID, EventCheckpointCreated, ck.CreatedAt.UnixMilli(), string(data))
	if err != nil {
		return fmt.Errorf("store: checkpoint event: %w", err)
	}
	if ck.LedgerSeq == 0 {
		ck.LedgerSeq, _ = res.LastInsertId()
	}
	if _, err := tx.ExecContext(wctx, `INSERT INTO checkpoints (`+checkpointCols+`) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)`,
		ck.ID, ck.SandboxID, ck.Tag, ck.Kind, ck.Image, ck.ImageDigest, ck.Runtime, string(cfg), ck.Size, ck.CaptureMS,
		ck.LedgerSeq, ck.CreatedAt.UnixMilli(), ck.FlushMS); err != nil {
		return fmt.Errorf("store: add checkpoint: %w", err)
	}
	return tx.Commit()
}

// GetCheckpoint returns a checkpoint by ID.
func (s *Store) GetCheckpoint(ctx context.Context, id string) (*Checkpoint, error) {
	ck, err := scanCheckpoint(s.db.QueryRowContext(ctx, `SELECT `+checkpointCols+` FROM checkpoints WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("checkpoint %q: %w", id, errdefs.ErrNotFound)
	}
	return ck, err
}

// ListCheckpoints returns a sandbox's checkpoints, oldest first ("" = all).
func (s *Store) ListCheckpoints(ctx context.Context, sandboxID string) ([]*Checkpoint, error) {
	q, args := `SELECT `+checkpointCols+` FROM checkpoints`, []any{}
	if sandboxID != "" {
		q, args = q+` WHERE sandbox_id = ?`, append(args, sandboxID)
	}
	return s.checkpoints(ctx, q+` ORDER BY created_at, ledger_seq, id`, args...)
}

// checkpoints runs a query of checkpoints (checkpointCols).
func (s *Store) checkpoints(ctx context.Context, q string, args ...any) ([]*Checkpoint, error) {
	rows, err := s.db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("store: list checkpoints: %w", err)
	}
	defer rows.Close()
	var out []*Checkpoint
	for rows.Next() {
		ck, err := scanCheckpoint(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, ck)
	}
	return out, rows.Err()
}

// DeleteCheckpoint removes a checkpoint's record.
func (s *Store) DeleteCheckpoint(ctx context.Context, id string) error {
	res, err := s.db.ExecContext(writeCtx(ctx), `DELETE FROM checkpoints WHERE id = ?`, id)
	if err != nil {
		return fmt.Errorf("store: delete checkpoint: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("checkpoint %q: %w", id, errdefs.ErrNotFound)
	}
	return nil
}

func scanCheckpoint(r scanner) (*Checkpoint, error) {
	var ck Checkpoint
	var cfg string
	var created int64
	if err := r.Scan(&ck.ID, &ck.SandboxID, &ck.Tag, &ck.Kind, &ck.Image, &ck.ImageDigest, &ck.Runtime, &cfg,
		&ck.Size, &ck.CaptureMS, &ck.LedgerSeq, &created, &ck.FlushMS); err != nil {
		return nil, err
	}
	if err := json.Unmarshal([]byte(cfg), &ck.Config); err != nil {
		return nil, fmt.Errorf("store: checkpoint %s config: %w", ck.ID, err)
	}
	ck.CreatedAt = time.UnixMilli(created)
	return &ck, nil
}

// AddReceivedCheckpoint records a checkpoint received from another node.
// Its source sandbox lives there, so no event is appended to a ledger
// here; the record keeps the source's ID, config and ledger position.
func (s *Store) AddReceivedCheckpoint(ctx context.Context, ck *Checkpoint) error {
	cfg, err := json.Marshal(ck.Config)
	if err != nil {
		return fmt.Errorf("store: %w", err)
	}
	if ck.CreatedAt.IsZero() {
		ck.CreatedAt = time.Now()
	}
	if _, err := s.db.ExecContext(writeCtx(ctx), `INSERT INTO checkpoints (`+checkpointCols+`) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)`,
		ck.ID, ck.SandboxID, ck.Tag, ck.Kind, ck.Image, ck.ImageDigest, ck.Runtime, string(cfg), ck.Size, ck.CaptureMS,
		ck.LedgerSeq, ck.CreatedAt.UnixMilli(), ck.FlushMS); err != nil {
		if strings.Contains(err.Error(), "UNIQUE") {
			return fmt.Errorf("checkpoint %s: %w", ck.ID, errdefs.ErrAlreadyExists)
		}
		return fmt.Errorf("store: add received checkpoint: %w", err)
	}
	return nil
}
