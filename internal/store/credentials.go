package store

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/forkbox/forkbox/errdefs"
)

// Credential is a named secret of a sandbox. Sealed is the value encrypted
// by the daemon; the store never sees the clear value.
type Credential struct {
	SandboxID string
	Name      string
	Env       string
	File      string
	PerFork   bool
	Sealed    []byte
	UpdatedAt time.Time
}

// PutCredential adds or replaces a credential, and records credentials.set
// (the name only) in the ledger, in one transaction.
func (s *Store) PutCredential(ctx context.Context, c *Credential) error {
	wctx := writeCtx(ctx) // its writes: see writeCtx
	tx, err := s.db.BeginTx(wctx, nil)
	if err != nil {
		return fmt.Errorf("store: %w", err)
	}
	defer tx.Rollback()
	c.UpdatedAt = time.Now()
	if _, err := tx.ExecContext(wctx, `INSERT OR REPLACE INTO credentials (sandbox_id, name, env, file, per_fork, sealed, updated_at)
		VALUES (?,?,?,?,?,?,?)`, c.SandboxID, c.Name, c.Env, c.File, c.PerFork, c.Sealed, c.UpdatedAt.UnixMilli()); err != nil {
		return fmt.Errorf("store: put credential: %w", err)
	}
	if _, err := tx.ExecContext(wctx, `INSERT INTO events (sandbox_id, type, time, data) VALUES (?,?,?,?)`,
		c.SandboxID, EventCredentialSet, c.UpdatedAt.UnixMilli(),
		credentialEventData(c)); err != nil {
		return fmt.Errorf("store: credential event: %w", err)
	}
	return tx.Commit()
}

// Credentials returns a sandbox's credentials, by name.
func (s *Store) Credentials(ctx context.Context, sandboxID string) ([]*Credential, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT sandbox_id, name, env, file, per_fork, sealed, updated_at FROM credentials
		WHERE sandbox_id = ? ORDER BY name`, sandboxID)
	if err != nil {
		return nil, fmt.Errorf("store: credentials: %w", err)
	}
	defer rows.Close()
	var out []*Credential
	for rows.Next() {
		var c Credential
		var t int64
		if err := rows.Scan(&c.SandboxID, &c.Name, &c.Env, &c.File, &c.PerFork, &c.Sealed, &t); err != nil {
			return nil, err
		}
		c.UpdatedAt = time.UnixMilli(t)
		out = append(out, &c)
	}
	return out, rows.Err()
}

// DeleteCredential removes a credential and records credentials.deleted.
func (s *Store) DeleteCredential(ctx context.Context, sandboxID, name string) error {
	res, err := s.db.ExecContext(writeCtx(ctx), `DELETE FROM credentials WHERE sandbox_id = ? AND name = ?`, sandboxID, name)
	if err != nil {
		return fmt.Errorf("store: delete credential: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("credential %q: %w", name, errdefs.ErrNotFound)
	}
	_, err = s.AppendEvent(ctx, sandboxID, EventCredentialDeleted, map[string]any{"name": name})
	return err
}

// credentialEventData is what the ledger keeps of a credential: never the value.
func credentialEventData(c *Credential) string {
	b, _ := json.Marshal(map[string]any{"name": c.Name, "env": c.Env, "file": c.File, "per_fork": c.PerFork})
	return string(b)
}
