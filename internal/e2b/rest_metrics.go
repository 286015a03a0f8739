package e2b

import (
	"fmt"
	"math"
	"net/http"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/daemon"
	"github.com/forkbox/forkbox/internal/store"
)

// metricJSON is E2B's SandboxMetric. forkbox reads the counters when
// asked (it keeps no history): one entry, its CPU use the average since the
// sandbox started.
type metricJSON struct {
	Timestamp     time.Time `json:"timestamp"`
	TimestampUnix int64     `json:"timestampUnix"`
	CPUCount      int       `json:"cpuCount"`
	CPUUsedPct    float64   `json:"cpuUsedPct"`
	MemUsed       int64     `json:"memUsed"`
	MemTotal      int64     `json:"memTotal"`
	MemCache      int64     `json:"memCache"`
	DiskUsed      int64     `json:"diskUsed"`
	DiskTotal     int64     `json:"diskTotal"`
}

func toMetric(m daemon.Metrics) metricJSON {
	cpus := int(math.Ceil(m.CPULimit))
	if cpus <= 0 {
		cpus = runtime.NumCPU()
	}
	pct := 0.0
	if age := m.Time.Sub(m.Sandbox.CreatedAt).Seconds(); age > 0 {
		pct = math.Min(100, 100*m.CPUSeconds/age/float64(cpus))
	}
	return metricJSON{Timestamp: m.Time.UTC(), TimestampUnix: m.Time.Unix(), CPUCount: cpus, CPUUsedPct: math.Round(pct*100) / 100,
		MemUsed: m.MemoryBytes, MemTotal: m.MemoryLimit, DiskUsed: m.DiskBytes, DiskTotal: m.DiskLimit}
}

func (s *Server) metrics(w http.ResponseWriter, r *http.Request) {
	sb, err := s.sandbox(r)
	if err != nil {
		fail(w, err)
		return
	}
	if e2bState(sb.State) != "running" {
		reply(w, http.StatusOK, []metricJSON{}) // paused: nothing runs
		return
	}
	ms, err := s.d.SandboxMetrics(r.Context(), sb.ID)
	if err != nil {
		fail(w, err)
		return
	}
	out := []metricJSON{}
	for _, m := range ms {
		out = append(out, toMetric(m))
	}
	reply(w, http.StatusOK, out)
}

// metricsMany is GET /sandboxes/metrics?sandbox_ids=a,b: the latest
// metric of each running sandbox named.
func (s *Server) metricsMany(w http.ResponseWriter, r *http.Request) {
	ids := strings.Split(r.URL.Query().Get("sandbox_ids"), ",")
	if len(ids) == 0 || ids[0] == "" || len(ids) > 100 {
		fail(w, fmt.Errorf("sandbox_ids: want 1 to 100 ids: %w", errdefs.ErrInvalidArgument))
		return
	}
	out := map[string]metricJSON{}
	for _, id := range ids {
		if err := checkID("sandbox", id); err != nil {
			fail(w, err)
			return
		}
		sb, err := s.liveSandbox(r.Context(), id)
		if err != nil || e2bState(sb.State) != "running" {
			continue
		}
		if ms, err := s.d.SandboxMetrics(r.Context(), sb.ID); err == nil && len(ms) == 1 {
			out[id] = toMetric(ms[0])
		}
	}
	reply(w, http.StatusOK, map[string]any{"sandboxes": out})
}

// logEntryJSON is E2B's SandboxLogEntry: forkbox's logs of a sandbox are
// its ledger, one entry per event.
type logEntryJSON struct {
	Timestamp time.Time         `json:"timestamp"`
	Level     string            `json:"level"`
	Message   string            `json:"message"`
	Fields    map[string]string `json:"fields"`
}

func toLogEntry(e *store.Event) logEntryJSON {
	f := map[string]string{"seq": strconv.FormatInt(e.Seq, 10)}
	keys := make([]string, 0, len(e.Data))
	for k := range e.Data {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if v := fmt.Sprint(e.Data[k]); len(v) <= 1024 {
			f[k] = v
		}
	}
	lvl := "info"
	if strings.Contains(e.Type, "fail") || e.Data["error"] != nil {
		lvl = "error"
	}
	return logEntryJSON{Timestamp: e.Time.UTC(), Level: lvl, Message: e.Type, Fields: f}
}

// logEntries returns a sandbox's ledger events from cursor (ms) on, at
// most limit, oldest first (or newest first for direction=backward).
func (s *Server) logEntries(r *http.Request, cursorParam string) ([]logEntryJSON, error) {
	id := r.PathValue("id")
	if err := checkID("sandbox", id); err != nil {
		return nil, err
	}
	sb, err := s.d.Get(r.Context(), id)
	if err != nil || sb.ID != id {
		return nil, fmt.Errorf("sandbox %q not found: %w", id, errdefs.ErrNotFound)
	}
	q := r.URL.Query()
	limit := 1000
	if l := q.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 0 || n > 1000 {
			return nil, fmt.Errorf("limit %q: want 0 to 1000: %w", l, errdefs.ErrInvalidArgument)
		}
		limit = n
	}
	var from int64
	if c := q.Get(cursorParam); c != "" {
		if from, err = strconv.ParseInt(c, 10, 64); err != nil || from < 0 {
			return nil, fmt.Errorf("%s %q: want milliseconds: %w", cursorParam, c, errdefs.ErrInvalidArgument)
		}
	}
	search := q.Get("search")
	if len(search) > 256 {
		return nil, fmt.Errorf("search: at most 256 bytes: %w", errdefs.ErrInvalidArgument)
	}
	evs, err := s.d.Events(r.Context(), sb.ID)
	if err != nil {
		return nil, err
	}
	if q.Get("direction") == "backward" {
		for i, j := 0, len(evs)-1; i < j; i, j = i+1, j-1 {
			evs[i], evs[j] = evs[j], evs[i]
		}
	}
	out := []logEntryJSON{}
	for _, e := range evs {
		if len(out) == limit {
			break
		}
		le := toLogEntry(e)
		if e.Time.UnixMilli() < from || (search != "" && !strings.Contains(le.Message, search)) ||
			(q.Get("level") == "error" && le.Level != "error") {
			continue
		}
		out = append(out, le)
	}
	return out, nil
}

func (s *Server) logs(w http.ResponseWriter, r *http.Request) {
	out, err := s.logEntries(r, "cursor")
	if err != nil {
		fail(w, err)
		return
	}
	reply(w, http.StatusOK, map[string]any{"logs": out})
}

func (s *Server) logsV1(w http.ResponseWriter, r *http.Request) {
	out, err := s.logEntries(r, "start")
	if err != nil {
		fail(w, err)
		return
	}
	type line struct {
		Timestamp time.Time `json:"timestamp"`
		Line      string    `json:"line"`
	}
	lines := []line{}
	for _, e := range out {
		lines = append(lines, line{Timestamp: e.Timestamp, Line: e.Message})
	}
	reply(w, http.StatusOK, map[string]any{"logs": lines, "logEntries": out})
}
