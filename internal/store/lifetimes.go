package store

import (
	"context"
	"fmt"
	"time"

	"github.com/forkbox/forkbox/errdefs"
)

// SetLifetime records a sandbox's timeout (kept in its config, so that
// its checkpoints' children inherit it), its deadline (zero: none) and the
// start of its lifetime; an unknown id is NotFound.
func (s *Store) SetLifetime(ctx context.Context, id string, timeoutMS int64, deadline, from time.Time) error {
	res, err := s.db.ExecContext(writeCtx(ctx), `UPDATE sandboxes SET config = json_set(config, '$.timeout_ms', ?), deadline = ?, lifetime_from = ?,
		updated_at = ? WHERE id = ?`, timeoutMS, unixMilli(deadline), unixMilli(from), time.Now().UnixMilli(), id)
	if err != nil {
		return fmt.Errorf("store: set lifetime: %w", err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return fmt.Errorf("sandbox %q: %w", id, errdefs.ErrNotFound)
	}
	return nil
}

// unixMilli is t in Unix milliseconds, 0 for the zero time.
func unixMilli(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

// fromUnixMilli is unixMilli's inverse.
func fromUnixMilli(ms int64) time.Time {
	if ms == 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms)
}
