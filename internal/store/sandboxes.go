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

// State is a sandbox's lifecycle state, as recorded. The state machine
// (which moves are allowed) lives in the daemon; the store only records,
// and changes a state only from the one the caller read (SwapSandboxState).
type State string

// Sandbox states.
const (
	StateCreating State = "creating"
	StateRunning  State = "running"
	StatePaused   State = "paused"
	// StateHibernating and StateHibernated: memory and processes saved to
	// disk, nothing running; the next exec wakes it.
	StateHibernating State = "hibernating"
	StateHibernated  State = "hibernated"
	// StateDegraded: after a daemon restart the sandbox's runtime reported
	// it running (or its runtime binary was missing) but it could not be
	// confirmed healthy. It is kept, never torn down, with the reason in
	// Error; a later reconcile or an explicit close deals with it.
	StateDegraded State = "degraded"
	StateFailed   State = "failed"
	StateClosing  State = "closing"
	StateClosed   State = "closed"
)

// SandboxConfig is what a sandbox was created with; it is stored as JSON.
type SandboxConfig struct {
	CPU         float64           `json:"cpu,omitempty"`
	CPUString   string            `json:"cpu_string,omitempty"`
	MemoryBytes int64             `json:"memory_bytes,omitempty"`
	MemoryStr   string            `json:"memory_string,omitempty"`
	Pids        int64             `json:"pids,omitempty"`
	DiskBytes   int64             `json:"disk_bytes,omitempty"`
	DiskStr     string            `json:"disk_string,omitempty"`
	Env         map[string]string `json:"env,omitempty"`
	Cwd         string            `json:"cwd,omitempty"`
	Egress      string            `json:"egress"`
	// EgressAllow and EgressDeny are the egress lists (CIDRs and DNS
	// names, canonical: see network.ParsePolicy); Egress is then "allow"
	// or "all".
	EgressAllow []string `json:"egress_allow,omitempty"`
	EgressDeny  []string `json:"egress_deny,omitempty"`
	Hostname    string   `json:"hostname"`
	Snapshotter string   `json:"snapshotter,omitempty"`
	MachineID   string   `json:"machine_id,omitempty"`
	// TimeoutMS is the sandbox's timeout (0 = none): its deadline is set
	// that far from its start, or from the last SetTimeout. Children
	// started from its checkpoints inherit it.
	TimeoutMS int64 `json:"timeout_ms,omitempty"`
	// OnTimeout is what its expiry does: "close" ("" too) or "hibernate".
	OnTimeout string `json:"on_timeout,omitempty"`
}

// Sandbox is one sandbox's record.
type Sandbox struct {
	ID          string
	Name        string
	State       State
	Image       string
	ImageDigest string
	Runtime     string
	Config      SandboxConfig
	IP          string
	AgentToken  string
	Error       string
	// ParentID is the sandbox this one was forked from.
	ParentID string
	// FromCheckpoint is the checkpoint this sandbox started from.
	FromCheckpoint string
	// Pool is the environment whose warm pool holds this sandbox ("" when
	// it is handed over or not pooled).
	Pool string
	// Deadline is when the sandbox expires by its own timeout (zero:
	// never); the daemon caps it by its max lifetime, counted from
	// LifetimeFrom (the sandbox's start, or its last wake).
	Deadline     time.Time
	LifetimeFrom time.Time
	CreatedAt    time.Time
	UpdatedAt    time.Time
}

const sandboxCols = `id, name, state, image, image_digest, runtime, config, ip, agent_token, error, created_at, updated_at, parent_id, from_checkpoint, pool, deadline, lifetime_from`

// CreateSandbox records a new sandbox. A live sandbox with the same name is
// an AlreadyExists error.
func (s *Store) CreateSandbox(ctx context.Context, sb *Sandbox) error {
	return createSandbox(ctx, s.db, sb)
}

// execer is a database or a transaction.
type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

func createSandbox(ctx context.Context, db execer, sb *Sandbox) error {
	cfg, err := json.Marshal(sb.Config)
	if err != nil {
		return fmt.Errorf("store: %w", err)
	}
	now := time.Now()
	sb.CreatedAt, sb.UpdatedAt = now, now
	_, err = db.ExecContext(writeCtx(ctx), `INSERT INTO sandboxes (`+sandboxCols+`) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)`,
		sb.ID, sb.Name, sb.State, sb.Image, sb.ImageDigest, sb.Runtime, string(cfg), sb.IP, sb.AgentToken, sb.Error,
		now.UnixMilli(), now.UnixMilli(), sb.ParentID, sb.FromCheckpoint, sb.Pool, unixMilli(sb.Deadline), unixMilli(sb.LifetimeFrom))
	if err != nil {
		if strings.Contains(err.Error(), "UNIQUE constraint failed") {
			return fmt.Errorf("a sandbox named %q already exists: %w", sb.Name, errdefs.ErrAlreadyExists)
		}
		return fmt.Errorf("store: create sandbox: %w", err)
	}
	return nil
}

// GetSandbox finds a sandbox by ID, or by name among live sandboxes (then the
// newest closed one of that name).
func (s *Store) GetSandbox(ctx context.Context, idOrName string) (*Sandbox, error) {
	row := s.db.QueryRowContext(ctx, `SELECT `+sandboxCols+` FROM sandboxes WHERE id = ?
		UNION ALL SELECT * FROM (SELECT `+sandboxCols+` FROM sandboxes WHERE name = ? ORDER BY state = 'closed', created_at DESC LIMIT 1)
		LIMIT 1`, idOrName, idOrName)
	sb, err := scanSandbox(row)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("sandbox %q: %w", idOrName, errdefs.ErrNotFound)
	}
	return sb, err
}

// ListSandboxes lists sandboxes, oldest first; closed ones only when all.
func (s *Store) ListSandboxes(ctx context.Context, all bool) ([]*Sandbox, error) {
	q := `SELECT ` + sandboxCols + ` FROM sandboxes`
	if !all {
		q += ` WHERE state != 'closed'`
	}
	rows, err := s.db.QueryContext(ctx, q+` ORDER BY created_at, id`)
	if err != nil {
		return nil, fmt.Errorf("store: list sandboxes: %w", err)
	}
	defer rows.Close()
	var out []*Sandbox
	for rows.Next() {
		sb, err := scanSandbox(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, sb)
	}
	return out, rows.Err()
}

// SwapSandboxState records state to (and error text, "" to clear) only if
// the sandbox is still in state from (compare-and-set). A sandbox in another
// state is a FailedPrecondition error naming both; an unknown one NotFound.
// Whether the move is allowed is the daemon's to decide (its state machine
// is the only caller).
func (s *Store) SwapSandboxState(ctx context.Context, id string, from, to State, errText string) error {
	return s.SwapSandboxStateNoting(ctx, id, from, to, errText, "", nil)
}

// SwapSandboxStateNoting is SwapSandboxState that also appends event typ
// (with data) to the sandbox's ledger, in the same transaction: no reader
// sees the new state without the event that says why ("" appends none).
func (s *Store) SwapSandboxStateNoting(ctx context.Context, id string, from, to State, errText, typ string, data map[string]any) error {
	wctx := writeCtx(ctx) // its writes: see writeCtx
	tx, err := s.db.BeginTx(wctx, nil)
	if err != nil {
		return fmt.Errorf("store: set state: %w", err)
	}
	defer tx.Rollback()
	now := time.Now()
	res, err := tx.ExecContext(wctx, `UPDATE sandboxes SET state = ?, error = ?, updated_at = ? WHERE id = ? AND state = ?`,
		to, errText, now.UnixMilli(), id, from)
	if err != nil {
		return fmt.Errorf("store: set state: %w", err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		var cur State
		err = tx.QueryRowContext(ctx, `SELECT state FROM sandboxes WHERE id = ?`, id).Scan(&cur)
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("sandbox %q: %w", id, errdefs.ErrNotFound)
		}
		if err != nil {
			return fmt.Errorf("store: set state: %w", err)
		}
		return fmt.Errorf("sandbox %s is %s, not %s, so it cannot become %s: %w", id, cur, from, to, errdefs.ErrFailedPrecondition)
	}
	if typ != "" {
		if data == nil {
			data = map[string]any{}
		}
		b, err := json.Marshal(data)
		if err != nil {
			return fmt.Errorf("store: event data: %w", err)
		}
		if _, err := tx.ExecContext(wctx, `INSERT INTO events (sandbox_id, type, time, data) VALUES (?,?,?,?)`,
			id, typ, now.UnixMilli(), string(b)); err != nil {
			return fmt.Errorf("store: append event: %w", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("store: set state: %w", err)
	}
	return nil
}

// SetAgentToken records a sandbox's new agent token (after the daemon
// rotated it); an unknown id is NotFound.
func (s *Store) SetAgentToken(ctx context.Context, id, token string) error {
	res, err := s.db.ExecContext(writeCtx(ctx), `UPDATE sandboxes SET agent_token = ?, updated_at = ? WHERE id = ?`, token, time.Now().UnixMilli(), id)
	if err != nil {
		return fmt.Errorf("store: set agent token: %w", err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return fmt.Errorf("sandbox %q: %w", id, errdefs.ErrNotFound)
	}
	return nil
}

// SetSandboxConfig records a sandbox's changed config (its egress policy
// changed on a live sandbox); an unknown id is NotFound.
func (s *Store) SetSandboxConfig(ctx context.Context, id string, cfg SandboxConfig) error {
	b, err := json.Marshal(cfg)
	if err != nil {
		return fmt.Errorf("store: sandbox config: %w", err)
	}
	res, err := s.db.ExecContext(writeCtx(ctx), `UPDATE sandboxes SET config = ?, updated_at = ? WHERE id = ?`, string(b), time.Now().UnixMilli(), id)
	if err != nil {
		return fmt.Errorf("store: set sandbox config: %w", err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return fmt.Errorf("sandbox %q: %w", id, errdefs.ErrNotFound)
	}
	return nil
}

// IPInUse reports whether a sandbox that is not closed, or a pre-booted
// sandbox, holds address ip.
func (s *Store) IPInUse(ctx context.Context, ip string) (bool, error) {
	var n int
	if err := s.db.QueryRowContext(ctx, `SELECT EXISTS(SELECT 1 FROM sandboxes WHERE ip = ? AND state != 'closed')
		OR EXISTS(SELECT 1 FROM preboots WHERE ip = ?)`, ip, ip).Scan(&n); err != nil {
		return false, fmt.Errorf("store: address in use: %w", err)
	}
	return n == 1, nil
}

type scanner interface{ Scan(...any) error }

func scanSandbox(r scanner) (*Sandbox, error) {
	var sb Sandbox
	var cfg string
	var created, updated, deadline, from int64
	if err := r.Scan(&sb.ID, &sb.Name, &sb.State, &sb.Image, &sb.ImageDigest, &sb.Runtime, &cfg, &sb.IP,
		&sb.AgentToken, &sb.Error, &created, &updated, &sb.ParentID, &sb.FromCheckpoint, &sb.Pool, &deadline, &from); err != nil {
		return nil, err
	}
	sb.Deadline, sb.LifetimeFrom = fromUnixMilli(deadline), fromUnixMilli(from)
	if sb.LifetimeFrom.IsZero() {
		sb.LifetimeFrom = time.UnixMilli(created)
	}
	if err := json.Unmarshal([]byte(cfg), &sb.Config); err != nil {
		return nil, fmt.Errorf("store: sandbox %s config: %w", sb.ID, err)
	}
	sb.CreatedAt, sb.UpdatedAt = time.UnixMilli(created), time.UnixMilli(updated)
	return &sb, nil
}

// TakeFromPool hands over one running sandbox of env's pool that started
// from checkpoint: it leaves the pool. It returns nil when none is ready.
func (s *Store) TakeFromPool(ctx context.Context, env, checkpoint string) (*Sandbox, error) {
	row := s.db.QueryRowContext(writeCtx(ctx), `UPDATE sandboxes SET pool = '', updated_at = ? WHERE id = (
		SELECT id FROM sandboxes WHERE pool = ? AND from_checkpoint = ? AND state = 'running' ORDER BY created_at LIMIT 1)
		RETURNING `+sandboxCols, time.Now().UnixMilli(), env, checkpoint)
	sb, err := scanSandbox(row)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	return sb, err
}

// Pooled returns the live sandboxes in env's pool, oldest first.
func (s *Store) Pooled(ctx context.Context, env string) ([]*Sandbox, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT `+sandboxCols+` FROM sandboxes WHERE pool = ? AND pool != '' AND state != 'closed' ORDER BY created_at, id`, env)
	if err != nil {
		return nil, fmt.Errorf("store: pooled sandboxes: %w", err)
	}
	defer rows.Close()
	var out []*Sandbox
	for rows.Next() {
		sb, err := scanSandbox(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, sb)
	}
	return out, rows.Err()
}

// ListSandboxesInState lists the sandboxes in state, oldest first: the
// periodic scans (idle hibernation, the degraded recheck) read only the
// rows they act on, whatever the number of others (an index on state).
func (s *Store) ListSandboxesInState(ctx context.Context, state State) ([]*Sandbox, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT `+sandboxCols+` FROM sandboxes WHERE state = ? ORDER BY created_at, id`, state)
	if err != nil {
		return nil, fmt.Errorf("store: list %s sandboxes: %w", state, err)
	}
	defer rows.Close()
	var out []*Sandbox
	for rows.Next() {
		sb, err := scanSandbox(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, sb)
	}
	return out, rows.Err()
}

// CountLive returns how many sandboxes are not closed.
func (s *Store) CountLive(ctx context.Context) (int, error) {
	var n int
	if err := s.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM sandboxes WHERE state != 'closed'`).Scan(&n); err != nil {
		return 0, fmt.Errorf("store: count sandboxes: %w", err)
	}
	return n, nil
}

// ClaimFromPool takes sandbox id out of env's pool; it reports false when
// the sandbox is no longer in that pool (a hand-over took it).
func (s *Store) ClaimFromPool(ctx context.Context, id, env string) (bool, error) {
	res, err := s.db.ExecContext(writeCtx(ctx), `UPDATE sandboxes SET pool = '', updated_at = ? WHERE id = ? AND pool = ?`,
		time.Now().UnixMilli(), id, env)
	if err != nil {
		return false, fmt.Errorf("store: claim from pool: %w", err)
	}
	n, _ := res.RowsAffected()
	return n == 1, nil
}
