package store

import (
	"context"
	"encoding/base64"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/forkbox/forkbox/errdefs"
)

func addSandboxes(t *testing.T, s *Store, from, n int) []string {
	t.Helper()
	var ids []string
	for i := from; i < from+n; i++ {
		sb := &Sandbox{ID: fmt.Sprintf("sb-%06d", i), Name: fmt.Sprintf("n%d", i), State: StateRunning, Image: "img", Runtime: "gvisor",
			Config: SandboxConfig{Egress: "none"}}
		if err := s.CreateSandbox(context.Background(), sb); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, sb.ID)
	}
	return ids
}

// pages reads every page of the sandbox list and checks each one's size.
func pages(t *testing.T, s *Store, all bool, size int) []string {
	t.Helper()
	want := size
	if size == 0 {
		want = DefaultPageSize
	}
	want = min(want, MaxPageSize)
	var ids []string
	tok := ""
	for i := 0; ; i++ {
		if i > 10000 {
			t.Fatal("pages do not end")
		}
		list, next, err := s.ListSandboxesPage(context.Background(), all, Page{Size: size, Token: tok})
		if err != nil {
			t.Fatal(err)
		}
		if len(list) > want || (next != "" && len(list) != want) {
			t.Fatalf("page %d: got %d rows (next %q), want %d", i, len(list), next, want)
		}
		for _, sb := range list {
			ids = append(ids, sb.ID)
		}
		if next == "" {
			return ids
		}
		tok = next
	}
}

func TestListSandboxesPages(t *testing.T) {
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "forkbox.db"))
	ids := addSandboxes(t, s, 0, 1234) // many share a created_at millisecond: id breaks the tie
	closed := map[string]bool{}
	for i := 0; i < len(ids); i += 10 {
		if err := s.SwapSandboxState(ctx, ids[i], StateRunning, StateClosed, ""); err != nil {
			t.Fatal(err)
		}
		closed[ids[i]] = true
	}
	var live []string
	for _, id := range ids {
		if !closed[id] {
			live = append(live, id)
		}
	}
	for _, size := range []int{1, 7, 0, 100, 1000, 5000} {
		if got := pages(t, s, false, size); strings.Join(got, ",") != strings.Join(live, ",") {
			t.Fatalf("size %d: got %d live sandboxes in pages, want %d in order", size, len(got), len(live))
		}
	}
	if got := pages(t, s, true, 333); strings.Join(got, ",") != strings.Join(ids, ",") {
		t.Fatalf("all: got %d sandboxes in pages, want %d in order", len(got), len(ids))
	}
	n, err := s.CountLive(ctx)
	if err != nil || n != len(live) {
		t.Fatalf("CountLive: got %d, %v, want %d", n, err, len(live))
	}

	// Rows closed or created between pages shift nothing: a closed one is
	// left out, a new one comes at the end.
	first, tok, err := s.ListSandboxesPage(ctx, false, Page{Size: 50})
	if err != nil || tok == "" || len(first) != 50 {
		t.Fatalf("first page: got %d rows, token %q, %v", len(first), tok, err)
	}
	if err := s.SwapSandboxState(ctx, first[10].ID, StateRunning, StateClosed, ""); err != nil {
		t.Fatal(err)
	}
	extra := addSandboxes(t, s, 5000, 1)
	second, _, err := s.ListSandboxesPage(ctx, false, Page{Size: 50, Token: tok})
	if err != nil || len(second) != 50 || second[0].ID != live[50] {
		t.Fatalf("second page after a change: got %d rows from %v, want 50 from %s", len(second), idOf(second), live[50])
	}
	rest := pages(t, s, false, 1000)
	if rest[len(rest)-1] != extra[0] {
		t.Fatalf("a sandbox created meanwhile: got last %s, want %s", rest[len(rest)-1], extra[0])
	}

	var plan string
	rows, err := s.db.QueryContext(ctx, `EXPLAIN QUERY PLAN SELECT id FROM sandboxes WHERE state != 'closed' AND (created_at, id) > (?, ?) ORDER BY created_at, id LIMIT 10`, 0, "")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var a, b, c int
		var d string
		rows.Scan(&a, &b, &c, &d)
		plan += d + ";"
	}
	rows.Close()
	if !strings.Contains(plan, "sandboxes_live_order") || strings.Contains(plan, "TEMP B-TREE") {
		t.Fatalf("a page of live sandboxes: got plan %q, want the sandboxes_live_order index without a sort", plan)
	}
}

func idOf(list []*Sandbox) string {
	if len(list) == 0 {
		return "nothing"
	}
	return list[0].ID
}

// TestPageTokenUntrusted: a page token is caller input. Forged, foreign,
// oversized and SQL-carrying tokens are InvalidArgument and change nothing.
func TestPageTokenUntrusted(t *testing.T) {
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "forkbox.db"))
	ids := addSandboxes(t, s, 0, 30)
	_, liveTok, err := s.ListSandboxesPage(ctx, false, Page{Size: 5})
	if err != nil || liveTok == "" {
		t.Fatal(err)
	}
	if _, err := s.AppendEvent(ctx, ids[0], EventSandboxCreated, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := s.AppendEvent(ctx, ids[0], EventSandboxReady, nil); err != nil {
		t.Fatal(err)
	}
	_, evTok, err := s.EventsPage(ctx, ids[0], Page{Size: 1})
	if err != nil || evTok == "" {
		t.Fatalf("events page: token %q, %v", evTok, err)
	}
	b64 := func(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }
	forged := func(key ...string) string { return encodeToken("sb", "live", key...) }
	bad := map[string]string{
		"garbage":           "not a token!",
		"padded base64":     base64.URLEncoding.EncodeToString([]byte("v1|sb|x|1|sb-1")),
		"too long":          strings.Repeat("A", 10000),
		"empty parts":       b64("||||"),
		"other version":     strings.Replace(liveTok, liveTok[:3], b64("v9|")[:3], 1),
		"other filter":      encodeToken("sb", "all", "0", "sb-000001"),
		"other kind":        encodeToken("ev", "live", "0", "sb-000001"),
		"sql in id":         forged("0", "x') OR 1=1; DROP TABLE sandboxes; --"),
		"sql in number":     forged("0 OR 1=1", "sb-000001"),
		"negative number":   forged("-1", "sb-000001"),
		"huge number":       forged("99999999999999999999999", "sb-000001"),
		"extra part":        forged("0", "sb-000001", "x"),
		"nul in id":         forged("0", "sb\x00"),
		"events elsewhere":  evTok, // a ledger token on the sandbox list
		"unicode id":        forged("0", "sb-é"),
		"hash of other sql": b64("v1|sb|" + filterHash("live") + "|0|' OR ''='"),
	}
	for name, tok := range bad {
		if _, _, err := s.ListSandboxesPage(ctx, false, Page{Token: tok}); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%s: got %v, want InvalidArgument", name, err)
		}
	}
	if _, _, err := s.ListSandboxesPage(ctx, true, Page{Token: liveTok}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("a live-list token on the all list: got %v, want InvalidArgument", err)
	}
	if _, _, err := s.EventsPage(ctx, ids[1], Page{Token: evTok}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("one sandbox's ledger token on another's: got %v, want InvalidArgument", err)
	}
	if _, _, err := s.ListCheckpointsPage(ctx, ids[0], Page{Token: evTok}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("a ledger token on checkpoints: got %v, want InvalidArgument", err)
	}
	if _, _, err := s.ListSandboxesPage(ctx, false, Page{Size: -1}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("negative page size: got %v, want InvalidArgument", err)
	}
	if got := pages(t, s, false, 7); len(got) != len(ids) {
		t.Fatalf("after the abuse: got %d sandboxes, want %d", len(got), len(ids))
	}
}

func TestEventsAndCheckpointsPages(t *testing.T) {
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "forkbox.db"))
	for i := range 25 {
		if _, err := s.AppendEvent(ctx, "sb-a", EventExecStarted, map[string]any{"i": i}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.AppendEvent(ctx, "sb-b", EventExecStarted, nil); err != nil {
			t.Fatal(err)
		}
		if err := s.AddCheckpoint(ctx, &Checkpoint{ID: fmt.Sprintf("ck-%03d", i), SandboxID: "sb-a", Tag: "t", Kind: "filesystem"}); err != nil {
			t.Fatal(err)
		}
	}
	var seqs []int64
	for tok, i := "", 0; i == 0 || tok != ""; i++ {
		evs, next, err := s.EventsPage(ctx, "sb-a", Page{Size: 10, Token: tok})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range evs {
			if e.SandboxID != "sb-a" {
				t.Fatalf("got an event of %s in sb-a's ledger", e.SandboxID)
			}
			seqs = append(seqs, e.Seq)
		}
		tok = next
	}
	all, _ := s.Events(ctx, "sb-a")
	if len(seqs) != len(all) || len(all) != 50 { // 25 execs + 25 checkpoint_created
		t.Fatalf("ledger pages: got %d events, want %d (50)", len(seqs), len(all))
	}
	for i := range seqs {
		if seqs[i] != all[i].Seq {
			t.Fatalf("event %d: got seq %d, want %d", i, seqs[i], all[i].Seq)
		}
	}
	var cks []string
	for tok, i := "", 0; i == 0 || tok != ""; i++ {
		page, next, err := s.ListCheckpointsPage(ctx, "sb-a", Page{Size: 4, Token: tok})
		if err != nil {
			t.Fatal(err)
		}
		if next != "" && len(page) != 4 {
			t.Fatalf("checkpoint page %d: got %d, want 4", i, len(page))
		}
		for _, ck := range page {
			cks = append(cks, ck.ID)
		}
		tok = next
	}
	if len(cks) != 25 || cks[0] != "ck-000" || cks[24] != "ck-024" {
		t.Fatalf("checkpoint pages: got %v, want ck-000..ck-024", cks)
	}
}
