// Package store owns forkbox's metadata and ledger: an embedded SQLite
// database (pure Go, modernc.org/sqlite) with versioned migrations.
//
// The daemon writes every state change here before acting on it, so that a
// restart can reconcile what the database says with what exists on the host.
// The ledger (events) is append-only.
package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/forkbox/forkbox/errdefs"
	_ "modernc.org/sqlite" // registers the "sqlite" driver
)

// Store is the metadata database. It is safe for concurrent use.
type Store struct {
	db *sql.DB
}

// migrations are applied in order; a database records the number applied.
// Never edit a released migration: append a new one.
var migrations = []string{
	`CREATE TABLE sandboxes (
		id           TEXT PRIMARY KEY,
		name         TEXT NOT NULL,
		state        TEXT NOT NULL,
		image        TEXT NOT NULL,
		image_digest TEXT NOT NULL,
		runtime      TEXT NOT NULL,
		config       TEXT NOT NULL,
		ip           TEXT NOT NULL DEFAULT '',
		agent_token  TEXT NOT NULL DEFAULT '',
		error        TEXT NOT NULL DEFAULT '',
		created_at   INTEGER NOT NULL,
		updated_at   INTEGER NOT NULL
	);
	CREATE UNIQUE INDEX sandboxes_live_name ON sandboxes(name) WHERE state != 'closed';
	CREATE TABLE events (
		seq        INTEGER PRIMARY KEY AUTOINCREMENT,
		sandbox_id TEXT NOT NULL,
		type       TEXT NOT NULL,
		time       INTEGER NOT NULL,
		data       TEXT NOT NULL DEFAULT '{}'
	);
	CREATE INDEX events_sandbox ON events(sandbox_id, seq);`,
	`ALTER TABLE sandboxes ADD COLUMN parent_id TEXT NOT NULL DEFAULT '';
	ALTER TABLE sandboxes ADD COLUMN from_checkpoint TEXT NOT NULL DEFAULT '';
	CREATE TABLE checkpoints (
		id           TEXT PRIMARY KEY,
		sandbox_id   TEXT NOT NULL,
		tag          TEXT NOT NULL,
		kind         TEXT NOT NULL,
		image        TEXT NOT NULL,
		image_digest TEXT NOT NULL,
		runtime      TEXT NOT NULL,
		config       TEXT NOT NULL,
		size         INTEGER NOT NULL,
		capture_ms   REAL NOT NULL,
		ledger_seq   INTEGER NOT NULL,
		created_at   INTEGER NOT NULL
	);
	CREATE INDEX checkpoints_sandbox ON checkpoints(sandbox_id, created_at);
	CREATE TABLE credentials (
		sandbox_id TEXT NOT NULL,
		name       TEXT NOT NULL,
		env        TEXT NOT NULL,
		file       TEXT NOT NULL,
		per_fork   INTEGER NOT NULL,
		sealed     BLOB NOT NULL,
		updated_at INTEGER NOT NULL,
		PRIMARY KEY (sandbox_id, name)
	);`,
	`ALTER TABLE checkpoints ADD COLUMN flush_ms REAL NOT NULL DEFAULT 0;`,
	`ALTER TABLE sandboxes ADD COLUMN pool TEXT NOT NULL DEFAULT '';
	CREATE TABLE environments (
		name         TEXT PRIMARY KEY,
		definition   TEXT NOT NULL,
		hash         TEXT NOT NULL,
		checkpoint   TEXT NOT NULL DEFAULT '',
		built_at     INTEGER NOT NULL DEFAULT 0,
		build_ms     REAL NOT NULL DEFAULT 0,
		state        TEXT NOT NULL,
		error        TEXT NOT NULL DEFAULT '',
		cached_steps INTEGER NOT NULL DEFAULT 0,
		updated_at   INTEGER NOT NULL
	);
	CREATE TABLE env_snapshots (
		hash       TEXT PRIMARY KEY,
		env        TEXT NOT NULL,
		checkpoint TEXT NOT NULL,
		steps      INTEGER NOT NULL,
		created_at INTEGER NOT NULL
	);`,
	// Lifetimes: deadline is the sandbox's own (from its timeout, 0 =
	// none), lifetime_from the start of its lifetime (0 = created_at),
	// which the daemon's --max-lifetime counts from.
	`ALTER TABLE sandboxes ADD COLUMN deadline INTEGER NOT NULL DEFAULT 0;
	ALTER TABLE sandboxes ADD COLUMN lifetime_from INTEGER NOT NULL DEFAULT 0;`,
	// What the E2B-compatible endpoint keeps beyond forkbox's own records
	// (see e2b.go): a sandbox's template and metadata, a snapshot's name.
	`CREATE TABLE e2b_objects (
		id         TEXT PRIMARY KEY,
		kind       TEXT NOT NULL,
		template   TEXT NOT NULL DEFAULT '',
		name       TEXT NOT NULL DEFAULT '',
		source     TEXT NOT NULL DEFAULT '',
		metadata   TEXT NOT NULL DEFAULT '{}',
		created_at INTEGER NOT NULL
	);`,
	// Density: list pages and the live count read indexes in list order,
	// whatever the number of closed sandboxes kept (page.go).
	`CREATE INDEX sandboxes_order ON sandboxes(created_at, id);
	CREATE INDEX sandboxes_live_order ON sandboxes(created_at, id) WHERE state != 'closed';
	CREATE INDEX sandboxes_pool ON sandboxes(pool) WHERE pool != '';
	CREATE INDEX sandboxes_live_ip ON sandboxes(ip) WHERE state != 'closed';
	CREATE INDEX sandboxes_state ON sandboxes(state);
	CREATE INDEX checkpoints_order ON checkpoints(created_at, ledger_seq, id);`,
	// Pre-booted sandboxes (preboots.go): booted, not yet handed out.
	`CREATE TABLE preboots (
		id         TEXT PRIMARY KEY,
		ip         TEXT NOT NULL,
		runtime    TEXT NOT NULL,
		created_at INTEGER NOT NULL
	);`,
}

// Open opens (creating if needed) the database at path and migrates it.
func Open(ctx context.Context, path string) (*Store, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	dsn := "file:" + path + "?_pragma=journal_mode(WAL)&_pragma=busy_timeout(5000)&_pragma=foreign_keys(1)&_pragma=synchronous(NORMAL)"
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("store: open %s: %w", path, err)
	}
	// One connection: SQLite has one writer anyway, and this keeps every
	// transaction serialised without SQLITE_BUSY surprises.
	db.SetMaxOpenConns(1)
	s := &Store{db: db}
	if err := s.migrate(ctx); err != nil {
		db.Close()
		return nil, err
	}
	return s, nil
}

// Close closes the database.
func (s *Store) Close() error { return s.db.Close() }

func (s *Store) migrate(ctx context.Context) error {
	wctx := writeCtx(ctx) // its writes: see writeCtx
	if _, err := s.db.ExecContext(wctx, `CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)`); err != nil {
		return fmt.Errorf("store: migrate: %w", err)
	}
	var v int
	err := s.db.QueryRowContext(ctx, `SELECT version FROM schema_version`).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) {
		if _, err := s.db.ExecContext(wctx, `INSERT INTO schema_version VALUES (0)`); err != nil {
			return fmt.Errorf("store: migrate: %w", err)
		}
	} else if err != nil {
		return fmt.Errorf("store: migrate: %w", err)
	}
	if v > len(migrations) {
		return fmt.Errorf("store: database schema %d is newer than this forkbox (%d): %w", v, len(migrations), errdefs.ErrFailedPrecondition)
	}
	for i := v; i < len(migrations); i++ {
		tx, err := s.db.BeginTx(wctx, nil)
		if err != nil {
			return fmt.Errorf("store: migrate: %w", err)
		}
		if _, err := tx.ExecContext(wctx, migrations[i]); err != nil {
			tx.Rollback()
			return fmt.Errorf("store: migration %d: %w", i+1, err)
		}
		if _, err := tx.ExecContext(wctx, `UPDATE schema_version SET version = ?`, i+1); err != nil {
			tx.Rollback()
			return fmt.Errorf("store: migration %d: %w", i+1, err)
		}
		if err := tx.Commit(); err != nil {
			return fmt.Errorf("store: migration %d: %w", i+1, err)
		}
	}
	return nil
}

// writeCtx is the context of a write: the caller's, without its
// cancellation. modernc's driver reports a statement during which the
// context ended as failed with the context's error even when the statement
// completed (an INSERT committed), so a caller that went away mid-write
// saw a ledger write fail that had been made: an exec.started whose exec
// then never ran and was never recorded finished. So a write runs to its
// end and reports what happened. Its wait for the store's one connection is
// no longer cut short by its caller either; reads (which lose nothing when
// cut) keep the caller's context.
func writeCtx(ctx context.Context) context.Context { return context.WithoutCancel(ctx) }
