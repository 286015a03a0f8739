package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"time"
)

// Ledger event types.
const (
	EventSandboxCreated = "sandbox.created"
	EventSandboxReady   = "sandbox.ready"
	EventSandboxFailed  = "sandbox.failed"
	EventSandboxClosed  = "sandbox.closed"
	EventSandboxLost    = "sandbox.lost"
	EventSandboxFound   = "sandbox.recovered"
	// EventSandboxDegraded: kept after a restart without being confirmed
	// healthy (see StateDegraded); data has the reason.
	EventSandboxDegraded = "sandbox.degraded"
	// EventSandboxExpired: the sandbox's deadline, the daemon's max
	// lifetime or its idle timeout passed; data has the reason and the
	// action taken (close or hibernate), recorded before it is taken.
	EventSandboxExpired = "sandbox.expired"
	// EventTimeoutSet: SetTimeout gave the sandbox a new timeout and
	// deadline.
	EventTimeoutSet   = "sandbox.timeout_set"
	EventExecStarted  = "exec.started"
	EventExecFinished = "exec.finished"
	EventFileWritten  = "file.written"
	// EventFilesCopied is a tar stream copied into a sandbox (CopyTo); it
	// is not replayed by Resume.
	EventFilesCopied = "files.copied"

	EventCheckpointCreated = "sandbox.checkpoint_created"
	EventForked            = "sandbox.forked"
	EventPaused            = "sandbox.paused"
	EventHibernated        = "sandbox.hibernated"
	EventIdleHibernated    = "sandbox.idle_hibernated"
	EventForkNotified      = "sandbox.fork_notified"
	EventCheckpointDeleted = "sandbox.checkpoint_deleted"
	EventWoken             = "sandbox.woken"
	EventUnpaused          = "sandbox.unpaused"
	EventRestored          = "sandbox.restored"
	EventResumed           = "sandbox.resumed"
	EventExecReplayed      = "exec.replayed"
	EventCredentialSet     = "credentials.set"
	EventCredentialDeleted = "credentials.deleted"
	// EventEgressChanged: a live sandbox's egress policy changed; data has
	// egress, allow and deny.
	EventEgressChanged = "sandbox.egress_changed"
)

// Event is one ledger entry.
type Event struct {
	Seq       int64
	SandboxID string
	Type      string
	Time      time.Time
	Data      map[string]any
}

// AppendEvent appends an event to a sandbox's ledger.
func (s *Store) AppendEvent(ctx context.Context, sandboxID, typ string, data map[string]any) (*Event, error) {
	if data == nil {
		data = map[string]any{}
	}
	b, err := json.Marshal(data)
	if err != nil {
		return nil, fmt.Errorf("store: event data: %w", err)
	}
	now := time.Now()
	res, err := s.db.ExecContext(writeCtx(ctx), `INSERT INTO events (sandbox_id, type, time, data) VALUES (?,?,?,?)`,
		sandboxID, typ, now.UnixMilli(), string(b))
	if err != nil {
		return nil, fmt.Errorf("store: append event: %w", err)
	}
	seq, _ := res.LastInsertId()
	return &Event{Seq: seq, SandboxID: sandboxID, Type: typ, Time: now, Data: data}, nil
}

// Events returns a sandbox's ledger, oldest first.
func (s *Store) Events(ctx context.Context, sandboxID string) ([]*Event, error) {
	return s.events(ctx, `SELECT seq, sandbox_id, type, time, data FROM events WHERE sandbox_id = ? ORDER BY seq`, sandboxID)
}

// events runs a query of events (seq, sandbox_id, type, time, data).
func (s *Store) events(ctx context.Context, q string, args ...any) ([]*Event, error) {
	rows, err := s.db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("store: events: %w", err)
	}
	defer rows.Close()
	var out []*Event
	for rows.Next() {
		var e Event
		var t int64
		var data string
		if err := rows.Scan(&e.Seq, &e.SandboxID, &e.Type, &t, &data); err != nil {
			return nil, err
		}
		e.Time = time.UnixMilli(t)
		if err := json.Unmarshal([]byte(data), &e.Data); err != nil {
			return nil, fmt.Errorf("store: event %d: %w", e.Seq, err)
		}
		out = append(out, &e)
	}
	return out, rows.Err()
}

// LastSeq returns the sequence number of a sandbox's newest ledger event
// (0 when it has none).
func (s *Store) LastSeq(ctx context.Context, sandboxID string) (int64, error) {
	var seq sql.NullInt64
	if err := s.db.QueryRowContext(ctx, `SELECT MAX(seq) FROM events WHERE sandbox_id = ?`, sandboxID).Scan(&seq); err != nil {
		return 0, fmt.Errorf("store: last seq: %w", err)
	}
	return seq.Int64, nil
}
