package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/forkbox/forkbox/errdefs"
)

// Environment states.
const (
	EnvNew      = "new"
	EnvBuilding = "building"
	EnvReady    = "ready"
	EnvFailed   = "failed"
)

// Environment is an environment's record. Definition is the JSON of its
// definition as the daemon keeps it.
type Environment struct {
	Name        string
	Definition  string
	Hash        string
	Checkpoint  string
	BuiltAt     time.Time
	BuildMS     float64
	State       string
	Error       string
	CachedSteps int
}

const envCols = `name, definition, hash, checkpoint, built_at, build_ms, state, error, cached_steps`

// PutEnvironment inserts or replaces an environment's record.
func (s *Store) PutEnvironment(ctx context.Context, e *Environment) error {
	_, err := s.db.ExecContext(writeCtx(ctx), `INSERT OR REPLACE INTO environments (`+envCols+`, updated_at) VALUES (?,?,?,?,?,?,?,?,?,?)`,
		e.Name, e.Definition, e.Hash, e.Checkpoint, e.BuiltAt.UnixMilli(), e.BuildMS, e.State, e.Error, e.CachedSteps, time.Now().UnixMilli())
	if err != nil {
		return fmt.Errorf("store: put environment: %w", err)
	}
	return nil
}

// GetEnvironment returns an environment by name.
func (s *Store) GetEnvironment(ctx context.Context, name string) (*Environment, error) {
	e, err := scanEnv(s.db.QueryRowContext(ctx, `SELECT `+envCols+` FROM environments WHERE name = ?`, name))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("environment %q: %w", name, errdefs.ErrNotFound)
	}
	return e, err
}

// ListEnvironments lists environments by name.
func (s *Store) ListEnvironments(ctx context.Context) ([]*Environment, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT `+envCols+` FROM environments ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("store: list environments: %w", err)
	}
	defer rows.Close()
	var out []*Environment
	for rows.Next() {
		e, err := scanEnv(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	return out, rows.Err()
}

// DeleteEnvironment removes an environment's record and returns the
// checkpoints of its built snapshots, for the caller to delete.
func (s *Store) DeleteEnvironment(ctx context.Context, name string) ([]string, error) {
	wctx := writeCtx(ctx) // its writes: see writeCtx
	tx, err := s.db.BeginTx(wctx, nil)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback()
	res, err := tx.ExecContext(wctx, `DELETE FROM environments WHERE name = ?`, name)
	if err != nil {
		return nil, fmt.Errorf("store: delete environment: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return nil, fmt.Errorf("environment %q: %w", name, errdefs.ErrNotFound)
	}
	rows, err := tx.QueryContext(wctx, `DELETE FROM env_snapshots WHERE env = ? RETURNING checkpoint`, name)
	if err != nil {
		return nil, fmt.Errorf("store: delete environment snapshots: %w", err)
	}
	var cks []string
	for rows.Next() {
		var ck string
		if err := rows.Scan(&ck); err != nil {
			rows.Close()
			return nil, err
		}
		cks = append(cks, ck)
	}
	rows.Close()
	return cks, tx.Commit()
}

// PutEnvSnapshot records the snapshot built for a definition hash (the
// whole definition, or a prefix of its steps).
func (s *Store) PutEnvSnapshot(ctx context.Context, hash, env, checkpoint string, steps int) error {
	_, err := s.db.ExecContext(writeCtx(ctx), `INSERT OR REPLACE INTO env_snapshots (hash, env, checkpoint, steps, created_at) VALUES (?,?,?,?,?)`,
		hash, env, checkpoint, steps, time.Now().UnixMilli())
	if err != nil {
		return fmt.Errorf("store: put env snapshot: %w", err)
	}
	return nil
}

// EnvSnapshot returns the checkpoint built for a hash, or "" if none.
func (s *Store) EnvSnapshot(ctx context.Context, hash string) (string, time.Time, error) {
	var ck string
	var created int64
	err := s.db.QueryRowContext(ctx, `SELECT checkpoint, created_at FROM env_snapshots WHERE hash = ?`, hash).Scan(&ck, &created)
	if errors.Is(err, sql.ErrNoRows) {
		return "", time.Time{}, nil
	}
	if err != nil {
		return "", time.Time{}, fmt.Errorf("store: env snapshot: %w", err)
	}
	return ck, time.UnixMilli(created), nil
}

func scanEnv(r scanner) (*Environment, error) {
	var e Environment
	var built int64
	if err := r.Scan(&e.Name, &e.Definition, &e.Hash, &e.Checkpoint, &built, &e.BuildMS, &e.State, &e.Error, &e.CachedSteps); err != nil {
		return nil, err
	}
	if built > 0 {
		e.BuiltAt = time.UnixMilli(built)
	}
	return &e, nil
}

// IsEnvSnapshot reports whether a checkpoint is an environment's snapshot:
// the current one of an environment, or a built step of one.
func (s *Store) IsEnvSnapshot(ctx context.Context, checkpoint string) (bool, error) {
	var n int
	err := s.db.QueryRowContext(ctx, `SELECT (SELECT count(*) FROM env_snapshots WHERE checkpoint = ?) +
		(SELECT count(*) FROM environments WHERE checkpoint = ?)`, checkpoint, checkpoint).Scan(&n)
	return n > 0, err
}
