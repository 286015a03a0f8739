package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/forkbox/forkbox/errdefs"
)

// Kinds of E2BObject.
const (
	E2BKindSandbox  = "sandbox"
	E2BKindSnapshot = "snapshot"
)

// E2BObject is what the E2B-compatible endpoint (internal/e2b) keeps of a
// sandbox or a snapshot beyond forkbox's own record. ID is the sandbox's or
// the snapshot's checkpoint's id.
type E2BObject struct {
	ID   string
	Kind string
	// Template is the template a sandbox was created from.
	Template string
	// Name is a snapshot's name; Source the sandbox it was taken of.
	Name, Source string
	Metadata     map[string]string
	CreatedAt    time.Time
}

const e2bCols = `id, kind, template, name, source, metadata, created_at`

// PutE2BObject records o, replacing what was recorded under its id.
func (s *Store) PutE2BObject(ctx context.Context, o *E2BObject) error {
	md, err := json.Marshal(o.Metadata)
	if err != nil {
		return fmt.Errorf("store: %w", err)
	}
	if o.CreatedAt.IsZero() {
		o.CreatedAt = time.Now()
	}
	_, err = s.db.ExecContext(writeCtx(ctx), `INSERT OR REPLACE INTO e2b_objects (`+e2bCols+`) VALUES (?,?,?,?,?,?,?)`,
		o.ID, o.Kind, o.Template, o.Name, o.Source, string(md), o.CreatedAt.UnixMilli())
	if err != nil {
		return fmt.Errorf("store: put e2b object: %w", err)
	}
	return nil
}

// GetE2BObject returns the object recorded under id.
func (s *Store) GetE2BObject(ctx context.Context, id string) (*E2BObject, error) {
	o, err := scanE2B(s.db.QueryRowContext(ctx, `SELECT `+e2bCols+` FROM e2b_objects WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("e2b object %q: %w", id, errdefs.ErrNotFound)
	}
	return o, err
}

// ListE2BObjects returns the objects of a kind, oldest first.
func (s *Store) ListE2BObjects(ctx context.Context, kind string) ([]*E2BObject, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT `+e2bCols+` FROM e2b_objects WHERE kind = ? ORDER BY created_at, id`, kind)
	if err != nil {
		return nil, fmt.Errorf("store: list e2b objects: %w", err)
	}
	defer rows.Close()
	var out []*E2BObject
	for rows.Next() {
		o, err := scanE2B(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, o)
	}
	return out, rows.Err()
}

// DeleteE2BObject forgets id; a missing id is no error.
func (s *Store) DeleteE2BObject(ctx context.Context, id string) error {
	if _, err := s.db.ExecContext(writeCtx(ctx), `DELETE FROM e2b_objects WHERE id = ?`, id); err != nil {
		return fmt.Errorf("store: delete e2b object: %w", err)
	}
	return nil
}

func scanE2B(r interface{ Scan(...any) error }) (*E2BObject, error) {
	var o E2BObject
	var md string
	var created int64
	if err := r.Scan(&o.ID, &o.Kind, &o.Template, &o.Name, &o.Source, &md, &created); err != nil {
		return nil, err
	}
	if err := json.Unmarshal([]byte(md), &o.Metadata); err != nil {
		return nil, fmt.Errorf("store: e2b object %s: metadata: %v: %w", o.ID, err, errdefs.ErrInternal)
	}
	o.CreatedAt = time.UnixMilli(created)
	return &o, nil
}
