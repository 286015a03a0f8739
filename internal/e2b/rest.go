package e2b

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"runtime"
	"strings"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/daemon"
	"github.com/forkbox/forkbox/internal/store"
)

// restRoutes is the REST plane's route table: what E2B's SDKs call for
// sandboxes. Everything else is refused with 501 and a message naming
// forkbox (see README, "Coming from E2B").
func (s *Server) restRoutes() *http.ServeMux {
	m := http.NewServeMux()
	m.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) })
	m.HandleFunc("POST /sandboxes", s.create)
	m.HandleFunc("POST /v2/sandboxes", s.create)
	m.HandleFunc("GET /sandboxes", s.listV1)
	m.HandleFunc("GET /v2/sandboxes", s.list)
	m.HandleFunc("GET /sandboxes/metrics", s.metricsMany)
	m.HandleFunc("GET /sandboxes/{id}", s.get)
	m.HandleFunc("DELETE /sandboxes/{id}", s.kill)
	m.HandleFunc("POST /sandboxes/{id}/timeout", s.timeout)
	m.HandleFunc("POST /sandboxes/{id}/refreshes", s.refresh)
	m.HandleFunc("POST /sandboxes/{id}/pause", s.pause)
	m.HandleFunc("POST /sandboxes/{id}/resume", s.resume)
	m.HandleFunc("POST /sandboxes/{id}/connect", s.connect)
	m.HandleFunc("POST /v2/sandboxes/{id}/connect", s.connect)
	m.HandleFunc("POST /sandboxes/{id}/fork", s.fork)
	m.HandleFunc("GET /sandboxes/{id}/metrics", s.metrics)
	m.HandleFunc("GET /sandboxes/{id}/logs", s.logsV1)
	m.HandleFunc("GET /v2/sandboxes/{id}/logs", s.logs)
	m.HandleFunc("POST /sandboxes/{id}/snapshots", s.snapshot)
	m.HandleFunc("GET /snapshots", s.snapshots)
	m.HandleFunc("DELETE /templates/{id}", s.deleteSnapshot)
	m.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		fail(w, notServed(fmt.Sprintf("%s %.128s (templates, volumes, secrets, teams and network updates are E2B cloud features; see forkbox's README)", r.Method, r.URL.Path)))
	})
	return m
}

// decode reads a JSON body of at most maxJSONBody bytes into v; an empty
// body leaves v as it is.
func decode(w http.ResponseWriter, r *http.Request, v any) error {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxJSONBody))
	if err != nil {
		return fmt.Errorf("request body: %v (at most %d bytes): %w", err, maxJSONBody, errdefs.ErrInvalidArgument)
	}
	if len(strings.TrimSpace(string(b))) == 0 {
		return nil
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("request body: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	return nil
}

func reply(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

// sandboxJSON is E2B's Sandbox: what create, connect and fork return.
type sandboxJSON struct {
	TemplateID         string  `json:"templateID"`
	SandboxID          string  `json:"sandboxID"`
	Alias              string  `json:"alias,omitempty"`
	ClientID           string  `json:"clientID"`
	EnvdVersion        string  `json:"envdVersion"`
	EnvdAccessToken    string  `json:"envdAccessToken"`
	TrafficAccessToken *string `json:"trafficAccessToken"`
	Domain             *string `json:"domain"`
}

// detailJSON is E2B's SandboxDetail and ListedSandbox.
type detailJSON struct {
	TemplateID      string            `json:"templateID"`
	Alias           string            `json:"alias,omitempty"`
	SandboxID       string            `json:"sandboxID"`
	ClientID        string            `json:"clientID"`
	StartedAt       time.Time         `json:"startedAt"`
	EndAt           time.Time         `json:"endAt"`
	EnvdVersion     string            `json:"envdVersion"`
	EnvdAccessToken string            `json:"envdAccessToken,omitempty"`
	CPUCount        int               `json:"cpuCount"`
	MemoryMB        int64             `json:"memoryMB"`
	DiskSizeMB      int64             `json:"diskSizeMB"`
	Metadata        map[string]string `json:"metadata"`
	State           string            `json:"state"`
	Lifecycle       *lifecycleJSON    `json:"lifecycle,omitempty"`
	VolumeMounts    []struct{}        `json:"volumeMounts"`
}

type lifecycleJSON struct {
	AutoResume bool   `json:"autoResume"`
	OnTimeout  string `json:"onTimeout"`
}

// noDeadline is the endAt of a sandbox without a deadline: E2B always has
// one, forkbox may not.
var noDeadline = time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC)

// e2bState is a sandbox's E2B state: running, or paused (paused,
// hibernated); "" for states E2B has no word for (closed, failed).
func e2bState(st store.State) string {
	switch st {
	case store.StateRunning, store.StateCreating, store.StateDegraded:
		return "running"
	case store.StatePaused, store.StateHibernating, store.StateHibernated:
		return "paused"
	}
	return ""
}

// info is what the endpoint knows of a sandbox's E2B side: from the store,
// or (for sandboxes made through forkbox's own API) derived.
func (s *Server) info(ctx context.Context, sb *store.Sandbox) *store.E2BObject {
	if o, err := s.d.Store().GetE2BObject(ctx, sb.ID); err == nil && o.Kind == store.E2BKindSandbox {
		return o
	}
	return &store.E2BObject{ID: sb.ID, Kind: store.E2BKindSandbox, Template: sb.Image}
}

func (s *Server) toSandbox(sb *store.Sandbox, template string) sandboxJSON {
	return sandboxJSON{TemplateID: template, SandboxID: sb.ID, ClientID: "forkbox", EnvdVersion: EnvdVersion,
		EnvdAccessToken: s.accessToken(sb.ID)}
}

func (s *Server) toDetail(ctx context.Context, sb *store.Sandbox, withToken bool) detailJSON {
	o := s.info(ctx, sb)
	end := s.d.ExpiresAt(sb)
	if end.IsZero() {
		end = noDeadline
	}
	md := o.Metadata
	if md == nil {
		md = map[string]string{}
	}
	cpus := int(math.Ceil(sb.Config.CPU))
	if cpus <= 0 {
		cpus = runtime.NumCPU()
	}
	onTimeout := "kill"
	if sb.Config.OnTimeout == daemon.OnTimeoutHibernate {
		onTimeout = "pause"
	}
	out := detailJSON{TemplateID: o.Template, SandboxID: sb.ID, ClientID: "forkbox", StartedAt: sb.CreatedAt.UTC(), EndAt: end.UTC(),
		EnvdVersion: EnvdVersion, CPUCount: cpus, MemoryMB: sb.Config.MemoryBytes >> 20, DiskSizeMB: sb.Config.DiskBytes >> 20,
		Metadata: md, State: e2bState(sb.State), Lifecycle: &lifecycleJSON{OnTimeout: onTimeout, AutoResume: onTimeout == "pause"},
		VolumeMounts: []struct{}{}}
	if withToken {
		out.EnvdAccessToken = s.accessToken(sb.ID)
	}
	return out
}

// sandbox returns the live sandbox named by the path's id: by id only (not
// by forkbox name), and not closed.
func (s *Server) sandbox(r *http.Request) (*store.Sandbox, error) {
	id := r.PathValue("id")
	if err := checkID("sandbox", id); err != nil {
		return nil, err
	}
	return s.liveSandbox(r.Context(), id)
}

func (s *Server) liveSandbox(ctx context.Context, id string) (*store.Sandbox, error) {
	sb, err := s.d.Get(ctx, id)
	if err != nil || sb.ID != id || e2bState(sb.State) == "" {
		return nil, fmt.Errorf("sandbox %q not found: %w", id, errdefs.ErrNotFound)
	}
	return sb, nil
}

func (s *Server) get(w http.ResponseWriter, r *http.Request) {
	sb, err := s.sandbox(r)
	if err != nil {
		fail(w, err)
		return
	}
	reply(w, http.StatusOK, s.toDetail(r.Context(), sb, true))
}

func (s *Server) kill(w http.ResponseWriter, r *http.Request) {
	sb, err := s.sandbox(r)
	if err != nil {
		fail(w, err)
		return
	}
	s.procs.dropSandbox(sb.ID)
	s.watchers.dropSandbox(sb.ID)
	defer s.pauses.drop(sb.ID)
	if err := s.d.Delete(r.Context(), sb.ID); err != nil {
		fail(w, err)
		return
	}
	if err := s.d.Store().DeleteE2BObject(r.Context(), sb.ID); err != nil {
		s.log.Warn("forget e2b sandbox", "sandbox", sb.ID, "err", err)
	}
	w.WriteHeader(http.StatusNoContent)
}

// seconds converts an E2B timeout in seconds; 0 means none in forkbox.
func seconds(n *int64) (time.Duration, error) {
	if n == nil {
		return 0, nil
	}
	if *n < 0 || *n > 30*24*3600 {
		return 0, fmt.Errorf("timeout %d s is not between 0 and 30 days: %w", *n, errdefs.ErrInvalidArgument)
	}
	return time.Duration(*n) * time.Second, nil
}

func (s *Server) timeout(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Timeout *int64 `json:"timeout"`
	}
	if err := decode(w, r, &req); err != nil {
		fail(w, err)
		return
	}
	sb, err := s.sandbox(r)
	if err != nil {
		fail(w, err)
		return
	}
	if req.Timeout == nil {
		fail(w, fmt.Errorf("timeout is required: %w", errdefs.ErrInvalidArgument))
		return
	}
	d, err := seconds(req.Timeout)
	if err == nil {
		_, err = s.d.SetTimeout(r.Context(), sb.ID, d)
	}
	if err != nil {
		fail(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// refresh extends a sandbox's life to at least now plus duration.
func (s *Server) refresh(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Duration *int64 `json:"duration"`
	}
	if err := decode(w, r, &req); err != nil {
		fail(w, err)
		return
	}
	sb, err := s.sandbox(r)
	if err != nil {
		fail(w, err)
		return
	}
	d, err := seconds(req.Duration)
	if err == nil && d > 0 {
		err = s.extend(r.Context(), sb, d)
	}
	if err != nil {
		fail(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// extend sets sb's deadline to now plus d unless it is already later.
func (s *Server) extend(ctx context.Context, sb *store.Sandbox, d time.Duration) error {
	if at := s.d.ExpiresAt(sb); at.IsZero() || time.Until(at) >= d {
		return nil
	}
	_, err := s.d.SetTimeout(ctx, sb.ID, d)
	return err
}
