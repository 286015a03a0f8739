// Package e2b serves an E2B-compatible endpoint in front of the daemon, so
// that code written for E2B's SDKs runs unchanged with
// E2B_API_URL=E2B_SANDBOX_URL=http://ADDR and E2B_API_KEY set to the
// daemon's API token. One address serves both of E2B's planes: the REST
// control plane (sandboxes, forks, snapshots, metrics, logs; see rest.go)
// and envd, the in-sandbox daemon (the process and filesystem Connect
// services and /files; see process.go, filesystem.go, files.go), which
// E2B's SDKs reach with the sandbox named in the E2b-Sandbox-Id header.
//
// It owns nothing of a sandbox's lifecycle: every call goes to the daemon
// through the same methods the forkbox API uses. What it keeps itself is
// the table of processes started through it (their output fans out to the
// streams attached to them), the polling watchers, and, in the store, each
// sandbox's E2B template and metadata. Every request is authenticated: the
// REST plane by the API key (X-API-Key), envd by the per-sandbox access
// token returned at create (X-Access-Token), an HMAC of the sandbox id
// under the API key, so one sandbox's token opens no other.
package e2b

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net/http"
	"regexp"
	"strings"
	"sync"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/daemon"
)

// EnvdVersion is the envd version the endpoint reports: E2B's SDKs enable
// features by it (0.5.7: closeStdin and octet-stream uploads; file metadata
// (0.6.2) and watch entries (0.6.3) are not served, and the SDKs refuse
// them before asking).
const EnvdVersion = "0.5.7"

// Bounds of untrusted input.
const (
	// maxJSONBody bounds a REST request body.
	maxJSONBody = 1 << 20
	// maxIDLen bounds a sandbox, snapshot or template id.
	maxIDLen = 128
	// maxHeaderValue bounds the headers the endpoint reads.
	maxHeaderValue = 512
)

// Header names E2B's SDKs send.
const (
	hdrAPIKey      = "X-API-Key"
	hdrAccessToken = "X-Access-Token"
	hdrSandboxID   = "E2b-Sandbox-Id"
)

// A sandbox id is forkbox's (sb-…); a template or snapshot id may also be
// an image reference (registry/name:tag) or a snapshot name.
var (
	sandboxIDRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]*$`)
	refRE       = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:/@+-]*$`)
)

// checkID validates an id from a caller: what is "sandbox", or the kind of
// reference (template, snapshot).
func checkID(what, id string) error {
	re := refRE
	if what == "sandbox" {
		re = sandboxIDRE
	}
	if id == "" || len(id) > maxIDLen || !re.MatchString(id) || strings.Contains(id, "..") {
		return fmt.Errorf("%s %.64q is not a valid id: %w", what, id, errdefs.ErrInvalidArgument)
	}
	return nil
}

// Config configures a Server.
type Config struct {
	// APIKey is the E2B API key callers send (the daemon's API token).
	APIKey string
	// DefaultTemplate, if set, is what templateID "base" (the SDKs' default
	// when none is given) creates from: an environment, image or snapshot.
	DefaultTemplate string
	Log             *slog.Logger
}

// Server is the E2B-compatible endpoint.
type Server struct {
	d    *daemon.Daemon
	cfg  Config
	log  *slog.Logger
	mux  *http.ServeMux
	envd http.Handler
	http *http.Server // set by Listen

	// ctx lives as long as the server: processes and watchers started
	// through it run under it; Close cancels it and waits for them.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	procs    *procTable
	watchers *watcherTable
	pauses   *pauseTable
	bash     sync.Map // sandbox id → bool: whether /bin/bash exists
}

// New returns the endpoint for d. The API key is required.
func New(d *daemon.Daemon, cfg Config) (*Server, error) {
	if cfg.APIKey == "" {
		return nil, fmt.Errorf("the E2B endpoint needs an API key (--api-token): %w", errdefs.ErrInvalidArgument)
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	s := &Server{d: d, cfg: cfg, log: cfg.Log.With("component", "e2b"), procs: newProcTable(), watchers: newWatcherTable(), pauses: newPauseTable()}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.mux = s.restRoutes()
	s.envd = s.envdRoutes()
	return s, nil
}

// Close ends every process stream and watcher started through the
// endpoint and waits for their goroutines.
func (s *Server) Close() error {
	s.cancel()
	s.wg.Wait()
	return nil
}

// go runs f as a goroutine the server owns: Close waits for it.
func (s *Server) goOwned(f func()) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		f()
	}()
}

// ServeHTTP routes a request to envd (it names a sandbox in
// E2b-Sandbox-Id) or to the REST plane.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	for _, h := range []string{hdrAPIKey, hdrAccessToken, hdrSandboxID} {
		if len(r.Header.Get(h)) > maxHeaderValue {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("header %s is longer than %d bytes", h, maxHeaderValue))
			return
		}
	}
	if r.Header.Get(hdrSandboxID) != "" {
		s.envd.ServeHTTP(w, r)
		return
	}
	if !s.apiKeyOK(r) {
		w.Header().Set("Connection", "close") // a refused caller keeps no connection
		writeError(w, http.StatusUnauthorized, "invalid or missing API key (X-API-Key must be the forkbox daemon's --api-token)")
		return
	}
	s.mux.ServeHTTP(w, r)
}

func (s *Server) apiKeyOK(r *http.Request) bool {
	k := r.Header.Get(hdrAPIKey)
	return k != "" && subtle.ConstantTimeCompare([]byte(k), []byte(s.cfg.APIKey)) == 1
}

// accessToken is sandbox id's envd access token.
func (s *Server) accessToken(id string) string {
	m := hmac.New(sha256.New, []byte(s.cfg.APIKey))
	m.Write([]byte("forkbox-e2b-envd\x00" + id))
	return hex.EncodeToString(m.Sum(nil))
}

func (s *Server) accessTokenOK(id, tok string) bool {
	return tok != "" && subtle.ConstantTimeCompare([]byte(tok), []byte(s.accessToken(id))) == 1
}
