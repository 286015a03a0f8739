package e2b

import (
	"encoding/base64"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/forkbox/forkbox/errdefs"
)

// Bounds of a list page.
const (
	defaultPage = 100
	maxPage     = 100
)

// listQuery is GET /v2/sandboxes's filters and page.
type listQuery struct {
	metadata     map[string]string
	states       map[string]bool
	desc         bool
	startedAfter time.Time
	template     string
	limit        int
	// after is the cursor: the last item of the previous page.
	afterMS int64
	afterID string
}

func parseListQuery(q url.Values) (listQuery, error) {
	lq := listQuery{desc: true, limit: defaultPage, states: map[string]bool{"running": true, "paused": true}}
	for k, v := range q {
		if len(k)+len(strings.Join(v, "")) > 4096 {
			return lq, fmt.Errorf("query parameter %.32q is too long: %w", k, errdefs.ErrInvalidArgument)
		}
	}
	if m := q.Get("metadata"); m != "" {
		pairs, err := url.ParseQuery(m)
		if err != nil {
			return lq, fmt.Errorf("metadata %q: %v: %w", m, err, errdefs.ErrInvalidArgument)
		}
		lq.metadata = map[string]string{}
		for k, v := range pairs {
			lq.metadata[k] = v[0]
		}
	}
	if st := q.Get("state"); st != "" {
		lq.states = map[string]bool{}
		for _, s := range strings.Split(st, ",") {
			if s != "running" && s != "paused" {
				return lq, fmt.Errorf("state %q: want running or paused: %w", s, errdefs.ErrInvalidArgument)
			}
			lq.states[s] = true
		}
	}
	switch q.Get("order") {
	case "", "desc":
	case "asc":
		lq.desc = false
	default:
		return lq, fmt.Errorf("order %q: want asc or desc: %w", q.Get("order"), errdefs.ErrInvalidArgument)
	}
	if a := q.Get("startedAfter"); a != "" {
		t, err := time.Parse(time.RFC3339Nano, a)
		if err != nil {
			return lq, fmt.Errorf("startedAfter %q: %v: %w", a, err, errdefs.ErrInvalidArgument)
		}
		lq.startedAfter = t
	}
	lq.template = q.Get("template")
	if l := q.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > maxPage {
			return lq, fmt.Errorf("limit %q: want 1 to %d: %w", l, maxPage, errdefs.ErrInvalidArgument)
		}
		lq.limit = n
	}
	if t := q.Get("nextToken"); t != "" {
		b, err := base64.RawURLEncoding.DecodeString(t)
		ms, id, ok := strings.Cut(string(b), ":")
		n, perr := strconv.ParseInt(ms, 10, 64)
		if err != nil || !ok || perr != nil || checkID("sandbox", id) != nil {
			return lq, fmt.Errorf("nextToken %.64q is not one this endpoint gave: %w", t, errdefs.ErrInvalidArgument)
		}
		lq.afterMS, lq.afterID = n, id
	}
	return lq, nil
}

func cursor(ms int64, id string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(ms, 10) + ":" + id))
}

// list is GET /v2/sandboxes: live sandboxes (not those in an environment's
// warm pool), filtered, ordered by start time and paged with X-Next-Token.
func (s *Server) list(w http.ResponseWriter, r *http.Request) {
	lq, err := parseListQuery(r.URL.Query())
	if err != nil {
		fail(w, err)
		return
	}
	out, next, running, err := s.listPage(r, lq)
	if err != nil {
		fail(w, err)
		return
	}
	if next != "" {
		w.Header().Set("X-Next-Token", next)
	}
	if lq.states["running"] {
		w.Header().Set("X-Total-Running", strconv.Itoa(running))
	}
	reply(w, http.StatusOK, out)
}

// listV1 is the deprecated GET /sandboxes: running sandboxes, unpaged.
func (s *Server) listV1(w http.ResponseWriter, r *http.Request) {
	lq, err := parseListQuery(url.Values{"metadata": {r.URL.Query().Get("metadata")}, "state": {"running"}})
	if err != nil {
		fail(w, err)
		return
	}
	lq.limit = 1 << 30
	out, _, _, err := s.listPage(r, lq)
	if err != nil {
		fail(w, err)
		return
	}
	reply(w, http.StatusOK, out)
}

func (s *Server) listPage(r *http.Request, lq listQuery) (page []detailJSON, next string, running int, err error) {
	ctx := r.Context()
	all, err := s.d.List(ctx, false)
	if err != nil {
		return nil, "", 0, err
	}
	var match []detailJSON
	for _, sb := range all {
		st := e2bState(sb.State)
		if sb.Pool != "" || st == "" || !lq.states[st] || (!lq.startedAfter.IsZero() && sb.CreatedAt.Before(lq.startedAfter)) {
			continue
		}
		d := s.toDetail(ctx, sb, false)
		if lq.template != "" && d.TemplateID != lq.template {
			continue
		}
		ok := true
		for k, v := range lq.metadata {
			if d.Metadata[k] != v {
				ok = false
				break
			}
		}
		if !ok {
			continue
		}
		if st == "running" {
			running++
		}
		match = append(match, d)
	}
	less := func(a, b detailJSON) int {
		if c := a.StartedAt.Compare(b.StartedAt); c != 0 {
			return c
		}
		return strings.Compare(a.SandboxID, b.SandboxID)
	}
	slices.SortFunc(match, func(a, b detailJSON) int {
		if lq.desc {
			return less(b, a)
		}
		return less(a, b)
	})
	start := 0
	if lq.afterID != "" {
		start = len(match)
		for i, d := range match {
			if d.StartedAt.UnixMilli() == lq.afterMS && d.SandboxID == lq.afterID {
				start = i + 1
				break
			}
			after := d.StartedAt.UnixMilli() > lq.afterMS || (d.StartedAt.UnixMilli() == lq.afterMS && d.SandboxID > lq.afterID)
			if after != lq.desc {
				start = i
				break
			}
		}
	}
	page = match[start:]
	if len(page) > lq.limit {
		page = page[:lq.limit]
		last := page[len(page)-1]
		next = cursor(last.StartedAt.UnixMilli(), last.SandboxID)
	}
	if page == nil {
		page = []detailJSON{}
	}
	return page, next, running, nil
}
