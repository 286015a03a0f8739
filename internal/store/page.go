package store

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"

	"github.com/forkbox/forkbox/errdefs"
)

// Pagination of the lists (sandboxes, a ledger, checkpoints): keyset pages
// in a stable order, so a page costs the same whatever the number of rows
// before it, and a row created or closed meanwhile never shifts the others.
//
// A page token is opaque to callers: base64url of "v1|kind|filter|key...",
// where filter is a hash of the request's filters (a token is valid only
// for the request that made it) and the key is the last row returned. It is
// untrusted input: it is bounded in length, decoded strictly, every key
// part is parsed as a number or checked against the identifier alphabet,
// and it reaches SQL only as bound parameters.

const (
	// DefaultPageSize is the page size of a request that gives none.
	DefaultPageSize = 100
	// MaxPageSize bounds a page; a larger request gets this many.
	MaxPageSize = 1000
	// maxTokenLen bounds a page token.
	maxTokenLen  = 512
	tokenVersion = "v1"
)

// Page asks for one page of a list: at most Size rows (0 = DefaultPageSize,
// more than MaxPageSize = MaxPageSize) after Token ("" = from the start).
type Page struct {
	Size  int
	Token string
}

// limit is the page's row count; a negative size is InvalidArgument.
func (p Page) limit() (int, error) {
	switch {
	case p.Size < 0:
		return 0, fmt.Errorf("page size %d: want 0 (the default, %d) to %d: %w", p.Size, DefaultPageSize, MaxPageSize, errdefs.ErrInvalidArgument)
	case p.Size == 0:
		return DefaultPageSize, nil
	default:
		return min(p.Size, MaxPageSize), nil
	}
}

// filterHash binds a token to the filters of the request that made it.
func filterHash(filter string) string {
	h := sha256.Sum256([]byte(filter))
	return hex.EncodeToString(h[:6])
}

// encodeToken makes the token of the page after the row with key.
func encodeToken(kind, filter string, key ...string) string {
	raw := strings.Join(append([]string{tokenVersion, kind, filterHash(filter)}, key...), "|")
	return base64.RawURLEncoding.EncodeToString([]byte(raw))
}

// decodeToken returns the key parts of a token of kind made for filter
// (want parts); "" is no key (the first page). Anything else is
// InvalidArgument.
func decodeToken(token, kind, filter string, want int) ([]string, error) {
	if token == "" {
		return nil, nil
	}
	bad := func(why string) error {
		return fmt.Errorf("page token is not valid for this request (%s): %w", why, errdefs.ErrInvalidArgument)
	}
	if len(token) > maxTokenLen {
		return nil, bad("too long")
	}
	raw, err := base64.RawURLEncoding.Strict().DecodeString(token)
	if err != nil {
		return nil, bad("not base64url")
	}
	parts := strings.Split(string(raw), "|")
	if len(parts) != 3+want || parts[0] != tokenVersion || parts[1] != kind {
		return nil, bad("malformed")
	}
	if parts[2] != filterHash(filter) {
		return nil, bad("made for other filters")
	}
	return parts[3:], nil
}

// tokenInt parses a token's numeric key part.
func tokenInt(s string) (int64, error) {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("page token is not valid for this request (bad key): %w", errdefs.ErrInvalidArgument)
	}
	return n, nil
}

// tokenID checks a token's identifier key part: letters, digits, '-', '_'
// and '.', at most 128 bytes.
func tokenID(s string) (string, error) {
	ok := s != "" && len(s) <= 128
	for _, r := range s {
		if !(r == '-' || r == '_' || r == '.' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z') {
			ok = false
			break
		}
	}
	if !ok {
		return "", fmt.Errorf("page token is not valid for this request (bad id): %w", errdefs.ErrInvalidArgument)
	}
	return s, nil
}

// ListSandboxesPage is one page of ListSandboxes (oldest first: created_at,
// then id), with the token of the next page ("" after the last).
func (s *Store) ListSandboxesPage(ctx context.Context, all bool, p Page) ([]*Sandbox, string, error) {
	n, err := p.limit()
	if err != nil {
		return nil, "", err
	}
	filter := "live"
	if all {
		filter = "all"
	}
	key, err := decodeToken(p.Token, "sb", filter, 2)
	if err != nil {
		return nil, "", err
	}
	var where []string
	var args []any
	if !all {
		where = append(where, `state != 'closed'`)
	}
	if key != nil {
		created, err := tokenInt(key[0])
		if err != nil {
			return nil, "", err
		}
		id, err := tokenID(key[1])
		if err != nil {
			return nil, "", err
		}
		where, args = append(where, `(created_at, id) > (?, ?)`), append(args, created, id)
	}
	q := `SELECT ` + sandboxCols + ` FROM sandboxes`
	if len(where) > 0 {
		q += ` WHERE ` + strings.Join(where, ` AND `)
	}
	rows, err := s.db.QueryContext(ctx, q+` ORDER BY created_at, id LIMIT ?`, append(args, n+1)...)
	if err != nil {
		return nil, "", fmt.Errorf("store: list sandboxes: %w", err)
	}
	defer rows.Close()
	var out []*Sandbox
	for rows.Next() {
		sb, err := scanSandbox(rows)
		if err != nil {
			return nil, "", err
		}
		out = append(out, sb)
	}
	if err := rows.Err(); err != nil {
		return nil, "", fmt.Errorf("store: list sandboxes: %w", err)
	}
	if len(out) <= n {
		return out, "", nil
	}
	out = out[:n]
	last := out[n-1]
	return out, encodeToken("sb", filter, strconv.FormatInt(last.CreatedAt.UnixMilli(), 10), last.ID), nil
}

// EventsPage is one page of a ledger (oldest first, by seq), with the token
// of the next page ("" after the last).
func (s *Store) EventsPage(ctx context.Context, sandboxID string, p Page) ([]*Event, string, error) {
	n, err := p.limit()
	if err != nil {
		return nil, "", err
	}
	key, err := decodeToken(p.Token, "ev", sandboxID, 1)
	if err != nil {
		return nil, "", err
	}
	var after int64
	if key != nil {
		if after, err = tokenInt(key[0]); err != nil {
			return nil, "", err
		}
	}
	out, err := s.events(ctx, `SELECT seq, sandbox_id, type, time, data FROM events WHERE sandbox_id = ? AND seq > ? ORDER BY seq LIMIT ?`,
		sandboxID, after, n+1)
	if err != nil || len(out) <= n {
		return out, "", err
	}
	out = out[:n]
	return out, encodeToken("ev", sandboxID, strconv.FormatInt(out[n-1].Seq, 10)), nil
}

// ListCheckpointsPage is one page of ListCheckpoints (oldest first:
// created_at, ledger_seq, then id), with the token of the next page (""
// after the last).
func (s *Store) ListCheckpointsPage(ctx context.Context, sandboxID string, p Page) ([]*Checkpoint, string, error) {
	n, err := p.limit()
	if err != nil {
		return nil, "", err
	}
	key, err := decodeToken(p.Token, "ck", sandboxID, 3)
	if err != nil {
		return nil, "", err
	}
	var where []string
	var args []any
	if sandboxID != "" {
		where, args = append(where, `sandbox_id = ?`), append(args, sandboxID)
	}
	if key != nil {
		created, err := tokenInt(key[0])
		if err != nil {
			return nil, "", err
		}
		seq, err := tokenInt(key[1])
		if err != nil {
			return nil, "", err
		}
		id, err := tokenID(key[2])
		if err != nil {
			return nil, "", err
		}
		where, args = append(where, `(created_at, ledger_seq, id) > (?, ?, ?)`), append(args, created, seq, id)
	}
	q := `SELECT ` + checkpointCols + ` FROM checkpoints`
	if len(where) > 0 {
		q += ` WHERE ` + strings.Join(where, ` AND `)
	}
	out, err := s.checkpoints(ctx, q+` ORDER BY created_at, ledger_seq, id LIMIT ?`, append(args, n+1)...)
	if err != nil || len(out) <= n {
		return out, "", err
	}
	out = out[:n]
	last := out[n-1]
	return out, encodeToken("ck", sandboxID, strconv.FormatInt(last.CreatedAt.UnixMilli(), 10),
		strconv.FormatInt(last.LedgerSeq, 10), last.ID), nil
}
