package store

import (
	"context"
	"fmt"
	"time"

	"github.com/forkbox/forkbox/errdefs"
)

// Preboot is a pre-booted sandbox not yet handed out: its ID (the one the
// sandbox it becomes will have) and address are taken, so that no other
// sandbox gets them. A preboot row is never re-adopted after a restart:
// the daemon tears down what it names and deletes it.
type Preboot struct {
	ID        string
	IP        string
	Runtime   string
	CreatedAt time.Time
}

// AddPreboot records a pre-booted sandbox before anything of it is made.
func (s *Store) AddPreboot(ctx context.Context, p *Preboot) error {
	p.CreatedAt = time.Now()
	if _, err := s.db.ExecContext(writeCtx(ctx), `INSERT INTO preboots (id, ip, runtime, created_at) VALUES (?,?,?,?)`,
		p.ID, p.IP, p.Runtime, p.CreatedAt.UnixMilli()); err != nil {
		return fmt.Errorf("store: add preboot: %w", err)
	}
	return nil
}

// DeletePreboot forgets a pre-booted sandbox (unknown: nil).
func (s *Store) DeletePreboot(ctx context.Context, id string) error {
	if _, err := s.db.ExecContext(writeCtx(ctx), `DELETE FROM preboots WHERE id = ?`, id); err != nil {
		return fmt.Errorf("store: delete preboot: %w", err)
	}
	return nil
}

// ListPreboots lists the pre-booted sandboxes not handed out.
func (s *Store) ListPreboots(ctx context.Context) ([]*Preboot, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT id, ip, runtime, created_at FROM preboots ORDER BY created_at`)
	if err != nil {
		return nil, fmt.Errorf("store: list preboots: %w", err)
	}
	defer rows.Close()
	var out []*Preboot
	for rows.Next() {
		var p Preboot
		var at int64
		if err := rows.Scan(&p.ID, &p.IP, &p.Runtime, &at); err != nil {
			return nil, err
		}
		p.CreatedAt = time.UnixMilli(at)
		out = append(out, &p)
	}
	return out, rows.Err()
}

// ClaimPreboot hands pre-booted sandbox sb.ID out: in one transaction its
// preboot row is deleted and sb (with that ID and the row's address) is
// recorded. A preboot that is not recorded (already handed out, or
// cleaned) is a NotFound error and nothing is recorded, so one pre-booted
// sandbox is never handed out twice, even across a crash.
func (s *Store) ClaimPreboot(ctx context.Context, sb *Sandbox) error {
	wctx := writeCtx(ctx) // its writes: see writeCtx
	tx, err := s.db.BeginTx(wctx, nil)
	if err != nil {
		return fmt.Errorf("store: claim preboot: %w", err)
	}
	defer tx.Rollback()
	res, err := tx.ExecContext(wctx, `DELETE FROM preboots WHERE id = ? AND ip = ?`, sb.ID, sb.IP)
	if err != nil {
		return fmt.Errorf("store: claim preboot: %w", err)
	}
	if n, err := res.RowsAffected(); err != nil || n != 1 {
		return fmt.Errorf("pre-booted sandbox %s (%s) is not recorded: %w", sb.ID, sb.IP, errdefs.ErrNotFound)
	}
	if err := createSandbox(ctx, tx, sb); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("store: claim preboot: %w", err)
	}
	return nil
}
